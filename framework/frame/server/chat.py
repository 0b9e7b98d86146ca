"""``POST /v1/chat/completions``: the model's chat template applied here, then the same engine path as completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from frame.engine.mp import EngineDeadError
from frame.errors import FrameUsageError
from frame.outputs import RequestOutput
from frame.server.checks import check_length, check_model, sampling_params
from frame.server.deps import default_max_tokens, get_state, new_id
from frame.server.errors import ServerError, dead_engine_body, usage_error_body
from frame.server.formatting import DONE, chat_logprobs, sse, usage, usage_counts
from frame.server.generation import ClientDisconnectedError, Generation, PromptJob
from frame.server.schemas import ChatCompletionRequest, ChatMessage
from frame.server.state import ServerState

router = APIRouter()


def apply_template(state: ServerState, messages: list[ChatMessage], add_generation_prompt: bool,
                   kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of a conversation through the model's chat template; a template error is a 400."""
    if not messages:
        raise FrameUsageError("messages is empty; send at least one message.", param="messages")
    conversation = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
    if state.tokenizer.chat_template is None:
        raise ServerError("This model has no chat template; use /v1/completions.", status=400,
                          code="no_chat_template", param="messages")
    try:
        ids = state.tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                                  tokenize=True, return_dict=False, **(kwargs or {}))
    except Exception as err:  # jinja raises for conversations a template refuses
        raise FrameUsageError(f"The chat template refused these messages: {err}.", param="messages") from None
    return list(ids)


def _logprobs_k(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None and not req.logprobs:
        raise FrameUsageError("top_logprobs needs logprobs set to true.", param="top_logprobs")
    if not req.logprobs:
        return None
    return req.top_logprobs or 0


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(req: ChatCompletionRequest, raw: Request,
                                 state: ServerState = Depends(get_state)) -> Response:
    check_model(req.model, state.model_names)
    if req.stream_options is not None and not req.stream:
        raise ServerError("stream_options is only allowed when stream is true.", status=400, code="unsupported",
                          param="stream_options")
    k = _logprobs_k(req)
    if k is not None and k > state.settings.limits.max_logprobs:
        raise ServerError(f"top_logprobs is {k}, over this server's limit of {state.settings.limits.max_logprobs}.",
                          status=400, code="limit_exceeded", param="top_logprobs")
    ids = apply_template(state, req.messages, req.add_generation_prompt, req.chat_template_kwargs)
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = asked if asked is not None else default_max_tokens(state, len(ids))
    params = sampling_params(req, state.settings.limits, max_tokens=max_tokens, logprobs=k,
                             vocab_size=state.info.vocab_size)
    check_length(len(ids), params.max_tokens, state.info.max_model_len)
    gen = Generation(state, new_id("chatcmpl"), [PromptJob(None, ids)], params, req.priority, req.cache_salt)
    gen.admit()
    created = int(time.time())
    if req.stream:
        return StreamingResponse(_stream(gen, req, state, created, k), media_type="text/event-stream",
                                 background=BackgroundTask(gen.release))
    try:
        results = await gen.collect(raw)
    except ClientDisconnectedError:
        return Response(status_code=499)
    choices = []
    for out in results[0].outputs:
        logprobs = chat_logprobs(out.token_ids, out.logprobs, k) if k is not None and out.logprobs else None
        choices.append({"index": out.index, "message": {"role": "assistant", "content": out.text},
                        "logprobs": logprobs, "finish_reason": out.finish_reason, "stop_reason": out.stop_reason})
    return JSONResponse({"id": gen.request_id, "object": "chat.completion", "created": created,
                         "model": state.model_name, "choices": choices, "usage": usage(results)})


async def _stream(gen: Generation, req: ChatCompletionRequest, state: ServerState, created: int,
                  k: int | None) -> AsyncIterator[str]:
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse({"id": gen.request_id, "object": "chat.completion.chunk", "created": created,
                    "model": state.model_name, "choices": choices, **extra})

    completion_tokens, cached = 0, 0
    try:
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None} for i in range(req.n)])
        async for _, item in gen.stream():
            if isinstance(item, RequestOutput):
                cached += item.num_cached_tokens
                continue
            completion_tokens += len(item.token_ids)
            if not item.text and item.finish_reason is None and item.logprobs is None:
                continue
            logprobs = chat_logprobs(item.token_ids, item.logprobs, k) if k is not None and item.logprobs else None
            delta = {"content": item.text} if item.text else {}
            yield chunk([{"index": item.index, "delta": delta, "logprobs": logprobs,
                          "finish_reason": item.finish_reason, "stop_reason": item.stop_reason}])
        if req.stream_options is not None and req.stream_options.include_usage:
            yield chunk([], usage=usage_counts(len(gen.jobs[0].ids), completion_tokens, cached))
    except EngineDeadError as err:
        yield sse(dead_engine_body(err))
    except FrameUsageError as err:
        yield sse(usage_error_body(err))
    yield DONE
