"""``POST /v1/chat/completions``: the chat template rendered (in a worker process), then the completions path;
with ``tools``, the calls the model makes come back as ``tool_calls`` (:mod:`frame.server.tools`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from frame.server.deps import get_state
from frame.server.formatting import chat_logprobs, sse, sse_stream, usage
from frame.server.generation import ClientDisconnectedError
from frame.server.schemas import ChatCompletionRequest
from frame.server.state import ServerState
from frame.server.tools import finish_reason, openai_calls, stream_safe_prefix
from frame.server.turns import ChatRun, finished_turn, start_chat

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(req: ChatCompletionRequest, raw: Request,
                                 state: ServerState = Depends(get_state)) -> Response:
    run = await start_chat(req, raw, state)
    gen, k = run.gen, run.k
    created = int(time.time())
    if req.stream:
        return StreamingResponse(sse_stream(_stream(run, req, state, created)),
                                 media_type="text/event-stream", background=BackgroundTask(gen.release))
    try:
        results = await gen.collect(raw)
    except ClientDisconnectedError:
        return Response(status_code=499)
    choices = []
    for out in results[0].outputs:
        logprobs = chat_logprobs(out.token_ids, out.logprobs, k) if k is not None and out.logprobs else None
        turn = finished_turn(run, out)
        message: dict[str, Any] = {"role": "assistant", "content": turn.content}
        if turn.calls:
            message["tool_calls"] = openai_calls(turn.calls)
        choices.append({"index": out.index, "message": message, "logprobs": logprobs,
                        "finish_reason": turn.finish_reason, "stop_reason": out.stop_reason})
    return JSONResponse({"id": gen.request_id, "object": "chat.completion", "created": created,
                         "model": state.model_name, "choices": choices,
                         "usage": usage(results, state.settings.prompt_tokens_details)})


async def _stream(run: ChatRun, req: ChatCompletionRequest, state: ServerState, created: int,
                  ) -> AsyncIterator[str]:
    gen, plan, k, parser = run.gen, run.plan, run.k, run.parser

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return sse({"id": gen.request_id, "object": "chat.completion.chunk", "created": created,
                    "model": state.model_name, "choices": choices, **extra})

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
        safe = 0 if plan.constrained else stream_safe_prefix(parser, text)  # type: ignore[arg-type]
        delta: dict[str, Any] = {"content": text[sent:safe]} if safe > sent else {}
        shown[item.index] = max(sent, safe)
        reason = item.finish_reason
        if reason is not None:
            parsed = run.parse(text)
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
