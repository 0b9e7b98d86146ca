"""``POST /v1/responses``: OpenAI's Responses API over the chat pipeline.

The request becomes a :class:`ChatCompletionRequest` (``instructions`` a system message first, input items chat
messages, function calls and their outputs assistant ``tool_calls`` and ``tool`` messages, ``text.format`` a
``response_format``, ``max_output_tokens`` ``max_tokens``), run by :func:`~frame.server.turns.start_chat`; its one
choice comes back as output items: a ``message`` with its ``output_text``, then one ``function_call`` per call.
With ``store`` (the default, as at OpenAI) the conversation is kept for ``previous_response_id``
(:mod:`frame.server.response_store`). Streaming is in :mod:`frame.server.responses_stream`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from frame.errors import FrameUsageError
from frame.server.auth import TENANT_SCOPE_KEY
from frame.server.deps import get_state
from frame.server.errors import ServerError
from frame.server.formatting import named_event, usage
from frame.server.responses_format import ResponseContext, output_items, response_usage
from frame.server.responses_schemas import FunctionCallItem, FunctionCallOutputItem, ResponsesRequest
from frame.server.responses_stream import response_events
from frame.server.schemas import ChatCompletionRequest, ChatMessage, FunctionDefinition
from frame.server.state import ServerState
from frame.server.turns import TurnEnd, event_stream, finish, start_chat, tool_call, translated

router = APIRouter()


def _text(content: str | list[Any]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def input_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """The request's input as chat messages (consecutive function calls join one assistant message)."""
    if isinstance(req.input, str):
        return [ChatMessage(role="user", content=req.input)]
    messages: list[ChatMessage] = []
    for item in req.input:
        if isinstance(item, FunctionCallItem):
            call = tool_call(item.call_id, item.name, item.arguments)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(ChatMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output)))
        else:
            messages.append(ChatMessage(role=item.role, content=_text(item.content)))
    return messages


def chat_request(req: ResponsesRequest, conversation: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat completions request that answers ``req`` over ``conversation``."""
    system = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    functions = [FunctionDefinition(name=t.name, description=t.description, parameters=t.parameters,
                                    strict=t.strict) for t in req.tools or []]
    choice = req.tool_choice
    fmt = req.text.format if req.text is not None else None
    return translated(system + conversation, functions, choice=choice if isinstance(choice, str | None) else None,
                      named=None if isinstance(choice, str | None) else choice.name,
                      fmt=fmt and fmt.type, schema=fmt and fmt.schema_, schema_name=(fmt and fmt.name) or "response",
                      model=req.model, max_tokens=req.max_output_tokens, temperature=req.temperature,
                      top_p=req.top_p, seed=req.seed, parallel_tool_calls=req.parallel_tool_calls)


def remembered(turn: TurnEnd, call_ids: list[str]) -> ChatMessage:
    """The turn as the assistant message a later ``previous_response_id`` request continues from."""
    calls = [tool_call(call_id, call.name, call.arguments) for call, call_id in zip(turn.calls, call_ids, strict=True)]
    return ChatMessage(role="assistant", content=turn.content, tool_calls=calls or None)


@router.post("/v1/responses", response_model=None)
async def create_response(req: ResponsesRequest, raw: Request, state: ServerState = Depends(get_state)) -> Response:
    if req.background:
        raise FrameUsageError("This server does not run responses in the background; leave background false.",
                              param="background")
    tenant = raw.scope.get(TENANT_SCOPE_KEY)
    history: list[ChatMessage] = []
    if req.previous_response_id is not None:
        found = state.responses.get(tenant, req.previous_response_id)
        if found is None:
            raise ServerError(f"The response '{req.previous_response_id}' is not stored here (it was made with "
                              "store false, or is older than the most recent ones this server keeps); send the "
                              "whole conversation as input.", status=404, code="response_not_found",
                              param="previous_response_id")
        history = found
    conversation = history + input_messages(req)
    run = await start_chat(chat_request(req, conversation), raw, state, prefix="resp")
    ctx = ResponseContext(f"resp_{uuid.uuid4().hex}", int(time.time()), req, state.model_name)

    def keep(turn: TurnEnd, call_ids: list[str]) -> None:
        if req.store is not False:
            state.responses.put(tenant, ctx.response_id, [*conversation, remembered(turn, call_ids)])

    if req.stream:
        details = state.settings.prompt_tokens_details
        events = response_events(ctx, run, lambda: response_usage(run.gen.usage(details)), keep)
        return event_stream(run, events, lambda body: named_event("error", {"type": "error", **body["error"]}))
    done = await finish(run, raw)
    if done is None:
        return Response(status_code=499)
    result, turn = done
    call_ids = [f"call_{uuid.uuid4().hex[:24]}" for _ in turn.calls]
    keep(turn, call_ids)
    counts = response_usage(usage([result], state.settings.prompt_tokens_details))
    return JSONResponse(ctx.body(turn.finish_reason, output_items(turn, call_ids), counts))
