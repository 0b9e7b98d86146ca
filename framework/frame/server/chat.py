"""``POST /v1/chat/completions``: the chat template rendered (in a worker process), then the completions path;
with ``tools``, the calls the model makes come back as ``tool_calls`` (:mod:`frame.server.tools`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from frame.errors import FrameUsageError
from frame.server.checks import check_length, check_model, sampling_params
from frame.server.constraints import requested_constraint
from frame.server.deps import cache_salt, default_max_tokens, get_state, new_id
from frame.server.errors import ServerError
from frame.server.formatting import chat_logprobs, sse, sse_stream, usage
from frame.server.generation import ClientDisconnectedError, Generation, PromptJob
from frame.server.schemas import ChatCompletionRequest
from frame.server.state import ServerState
from frame.server.tools import ToolPlan, finish_reason, openai_calls, parse_output, plan_tools, template_tools

router = APIRouter()


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
    plan = plan_tools(req)
    constraint = (plan.constraint, "tools") if plan.constraint is not None else requested_constraint(req)
    if constraint is not None:
        await state.constraints.check(*constraint)
    if plan.mode == "auto":
        _ = state.tool_parser  # loaded now, so a broken parser fails this request, not a stream mid-way
    ids = await state.prompts.chat(req.messages, req.add_generation_prompt, req.chat_template,
                                   req.chat_template_kwargs, template_tools(req, plan))
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = asked if asked is not None else default_max_tokens(state, len(ids))
    params = sampling_params(req, state.settings.limits, max_tokens=max_tokens, logprobs=k,
                             vocab_size=state.info.vocab_size,
                             max_speculative_tokens=state.info.max_speculative_tokens,
                             structured_outputs=constraint and constraint[0])
    check_length(len(ids), params.max_tokens, state.info.max_model_len)
    gen = Generation(state, new_id("chatcmpl"), [PromptJob(None, ids)], params, req.priority,
                     cache_salt(raw, req.cache_salt))
    gen.admit()
    created = int(time.time())
    if req.stream:
        return StreamingResponse(sse_stream(_stream(gen, req, state, created, k, plan)),
                                 media_type="text/event-stream", background=BackgroundTask(gen.release))
    try:
        results = await gen.collect(raw)
    except ClientDisconnectedError:
        return Response(status_code=499)
    choices = []
    parser = state.tool_parser if plan.mode == "auto" else None
    for out in results[0].outputs:
        logprobs = chat_logprobs(out.token_ids, out.logprobs, k) if k is not None and out.logprobs else None
        parsed = parse_output(plan, out.text, parser)
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            message["tool_calls"] = openai_calls(parsed.calls)
        choices.append({"index": out.index, "message": message, "logprobs": logprobs,
                        "finish_reason": finish_reason(out.finish_reason, parsed), "stop_reason": out.stop_reason})
    return JSONResponse({"id": gen.request_id, "object": "chat.completion", "created": created,
                         "model": state.model_name, "choices": choices,
                         "usage": usage(results, state.settings.prompt_tokens_details)})


async def _stream(gen: Generation, req: ChatCompletionRequest, state: ServerState, created: int,
                  k: int | None, plan: ToolPlan) -> AsyncIterator[str]:
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse({"id": gen.request_id, "object": "chat.completion.chunk", "created": created,
                    "model": state.model_name, "choices": choices, **extra})

    parser = state.tool_parser if plan.mode == "auto" else None
    texts: dict[int, str] = {}  # each choice's text so far
    shown: dict[int, int] = {}  # how much of it went out as content
    role = chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                   "finish_reason": None} for i in range(req.n)])
    # The role goes out with the first token, as vLLM sends it: clients time the first token by the first chunk
    # (vLLM's `bench serve` does), so a role chunk sent on arrival would report the prefill as decode time.
    role_sent = False
    async for _, item in gen.deltas():
        if not role_sent:
            role_sent = True
            yield role
        logprobs = chat_logprobs(item.token_ids, item.logprobs, k) if k is not None and item.logprobs else None
        if plan.mode == "none":
            delta = {"content": item.text} if item.text else {}
            yield chunk([{"index": item.index, "delta": delta, "logprobs": logprobs,
                          "finish_reason": item.finish_reason, "stop_reason": item.stop_reason}])
            continue
        text = texts[item.index] = texts.get(item.index, "") + item.text
        sent = shown.get(item.index, 0)
        # Constrained output is the calls' JSON, never content; with auto, what the parser calls safe goes out.
        safe = 0 if plan.constrained else parser.stream_safe_prefix(text)  # type: ignore[union-attr]
        delta: dict[str, Any] = {"content": text[sent:safe]} if safe > sent else {}
        shown[item.index] = max(sent, safe)
        reason = item.finish_reason
        if reason is not None:
            parsed = parse_output(plan, text, parser)
            rest = (parsed.content or "")[shown[item.index]:] if not plan.constrained or not parsed.calls else ""
            if rest:
                delta["content"] = delta.get("content", "") + rest
            if parsed.calls:
                delta["tool_calls"] = openai_calls(parsed.calls, indexed=True)
            reason = finish_reason(reason, parsed)
        if delta or logprobs is not None or reason is not None:
            yield chunk([{"index": item.index, "delta": delta, "logprobs": logprobs, "finish_reason": reason,
                          "stop_reason": item.stop_reason}])
    if not role_sent:
        yield role
    if req.stream_options is not None and req.stream_options.include_usage:
        yield chunk([], usage=gen.usage(state.settings.prompt_tokens_details))
