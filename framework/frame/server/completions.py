"""``POST /v1/completions``: text or token-id prompts (one or a batch), streamed as SSE or answered whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from frame.errors import FrameUsageError
from frame.outputs import RequestOutput
from frame.server.checks import check_length, check_model, sampling_params
from frame.server.constraints import requested_constraint
from frame.server.deps import cache_salt, check_ids, default_max_tokens, get_state, new_id
from frame.server.errors import ServerError
from frame.server.formatting import (
    completion_logprobs,
    echo_logprobs,
    prompt_logprobs_json,
    sse,
    sse_stream,
    usage_counts,
)
from frame.server.generation import ClientDisconnectedError, Generation, PromptJob
from frame.server.schemas import CompletionRequest
from frame.server.state import ServerState

router = APIRouter()


async def _jobs(state: ServerState, prompt: str | list[str] | list[int] | list[list[int]]) -> list[PromptJob]:
    """The prompts of a request, tokenised (the schema guarantees no prompt and no list is empty)."""
    if isinstance(prompt, str):
        return [PromptJob(prompt, ids) for ids in await state.prompts.encode([prompt])]
    limit = state.settings.limits.max_prompts
    if len(prompt) > limit and not isinstance(prompt[0], int):
        raise ServerError(f"prompt holds {len(prompt)} prompts, over this server's limit of {limit}.",
                          status=400, code="limit_exceeded", param="prompt")
    if isinstance(prompt[0], int):
        return [PromptJob(None, check_ids(state, list(prompt)))]  # type: ignore[arg-type]
    if isinstance(prompt[0], str):
        texts: list[str] = prompt  # type: ignore[assignment]
        return [PromptJob(p, ids) for p, ids in zip(texts, await state.prompts.encode(texts), strict=True)]
    return [PromptJob(None, check_ids(state, list(p))) for p in prompt]  # type: ignore[arg-type]


def _prompt_k(req: CompletionRequest) -> int | None:
    """The top-k of the prompt logprobs the request needs: ``echo`` with ``logprobs`` scores the prompt (OpenAI),
    and so does vLLM's ``prompt_logprobs``; None when it needs none."""
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    return max(asked) if asked else None


def _unsupported(req: CompletionRequest) -> None:
    def refuse(param: str, why: str) -> ServerError:
        return ServerError(f"{param} {why}.", status=400, code="unsupported", param=param)

    if req.suffix:
        raise refuse("suffix", "is not supported by this server")
    if req.best_of is not None and req.best_of != req.n:
        raise refuse("best_of", f"must equal n ({req.n}) on this server")
    if req.max_tokens == 0 and not req.echo:
        raise FrameUsageError("max_tokens must be at least 1 unless echo is true (then 0 returns the prompt "
                              "and generates nothing).", param="max_tokens")
    if req.stream and (_prompt_k(req) is not None or req.max_tokens == 0):
        raise refuse("stream", "cannot be combined with prompt logprobs (echo with logprobs, or prompt_logprobs) "
                     "or max_tokens 0 on this server; send stream: false")
    if req.stream_options is not None and not req.stream:
        raise refuse("stream_options", "is only allowed when stream is true")


@router.post("/v1/completions", response_model=None)
async def create_completion(req: CompletionRequest, raw: Request,
                            state: ServerState = Depends(get_state)) -> Response:
    check_model(req.model, state.model_names)
    _unsupported(req)
    jobs = await _jobs(state, req.prompt)
    longest = max(len(j.ids) for j in jobs)
    max_tokens = req.max_tokens if req.max_tokens is not None else default_max_tokens(state, longest)
    limit = state.settings.limits.max_tokens
    if "max_tokens" not in req.model_fields_set and limit is not None:
        max_tokens = min(max_tokens, limit)  # OpenAI's default of 16 never exceeds the operator's limit
    constraint = requested_constraint(req)
    if constraint is not None:
        await state.constraints.check(*constraint, raw.is_disconnected)
    # max_tokens 0 (echo only): the engine samples one token, which the response leaves out, as vLLM does.
    params = sampling_params(req, state.settings.limits, max_tokens=max_tokens or 1, logprobs=req.logprobs,
                             vocab_size=state.info.vocab_size,
                             max_speculative_tokens=state.info.max_speculative_tokens,
                             structured_outputs=constraint and constraint[0], prompt_logprobs=_prompt_k(req))
    for job in jobs:
        check_length(len(job.ids), params.max_tokens, state.info.max_model_len)
    gen = Generation(state, new_id("cmpl"), jobs, params, req.priority, cache_salt(raw, req.cache_salt))
    if constraint is not None:
        await state.constraints.drop_if_gone(raw.is_disconnected)
    gen.admit()
    created = int(time.time())
    if req.stream:
        return StreamingResponse(sse_stream(_stream(gen, req, state, created)), media_type="text/event-stream",
                                 background=BackgroundTask(gen.release))
    try:
        results = await gen.collect(raw)
    except ClientDisconnectedError:
        return Response(status_code=499)
    return JSONResponse(_body(gen, req, state, created, results))


def _text(state: ServerState, job: PromptJob) -> str:
    return job.text if job.text is not None else state.tokenizer.decode(job.ids)


def _body(gen: Generation, req: CompletionRequest, state: ServerState, created: int,
          results: list[RequestOutput]) -> dict[str, Any]:
    choices = []
    generated = 0
    for p, result in enumerate(results):
        prefix = _text(state, gen.jobs[p]) if req.echo else ""
        for out in result.outputs:
            nothing = req.max_tokens == 0
            token_ids, text = ([], "") if nothing else (out.token_ids, out.text)
            positions = [] if nothing else out.logprobs or []
            generated += len(token_ids)
            choice = {"index": p * req.n + out.index, "text": prefix + text, "logprobs": None,
                      "finish_reason": "length" if nothing else out.finish_reason,
                      "stop_reason": None if nothing else out.stop_reason}
            if req.logprobs is not None and req.echo and result.prompt_logprobs is not None:
                first = state.tokenizer.decode([result.prompt_token_ids[0]])
                choice["logprobs"] = echo_logprobs(first, result.prompt_token_ids, result.prompt_logprobs,
                                                   token_ids, positions, req.logprobs)
            elif req.logprobs is not None and out.logprobs is not None:
                choice["logprobs"] = completion_logprobs(token_ids, positions, req.logprobs)
            if req.prompt_logprobs is not None and result.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs_json(result.prompt_logprobs, req.prompt_logprobs)
            choices.append(choice)
    prompt_tokens = sum(len(r.prompt_token_ids) for r in results)
    cached = sum(r.num_cached_tokens for r in results)
    return {"id": gen.request_id, "object": "text_completion", "created": created, "model": state.model_name,
            "choices": choices,
            "usage": usage_counts(prompt_tokens, generated, cached, state.settings.prompt_tokens_details)}


async def _stream(gen: Generation, req: CompletionRequest, state: ServerState, created: int) -> AsyncIterator[str]:
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse({"id": gen.request_id, "object": "text_completion", "created": created,
                    "model": state.model_name, "choices": choices, **extra})

    offsets: dict[int, int] = {}
    if req.echo:
        for p, job in enumerate(gen.jobs):
            text = _text(state, job)
            yield chunk([{"index": p * req.n + i, "text": text, "logprobs": None, "finish_reason": None}
                         for i in range(req.n)])
    async for p, item in gen.deltas():
        index = p * req.n + item.index
        logprobs = None
        if item.logprobs is not None and req.logprobs is not None:
            logprobs = completion_logprobs(item.token_ids, item.logprobs, req.logprobs, offsets.get(index, 0))
            offsets[index] = offsets.get(index, 0) + sum(len(t) for t in logprobs["tokens"])
        yield chunk([{"index": index, "text": item.text, "logprobs": logprobs,
                      "finish_reason": item.finish_reason, "stop_reason": item.stop_reason}])
    if req.stream_options is not None and req.stream_options.include_usage:
        yield chunk([], usage=gen.usage(state.settings.prompt_tokens_details))
