"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API over the chat pipeline.

The request becomes a :class:`ChatCompletionRequest`: ``system`` a system message first; a user turn's
``tool_result`` blocks ``tool`` messages, then its text; an assistant turn's ``tool_use`` blocks its
``tool_calls``; ``tool_choice`` ``any`` is chat's ``required``, ``tool`` a named function, and
``disable_parallel_tool_use`` turns parallel calls off; ``stop_sequences`` are stop strings;
``output_config.format`` is a json_schema ``response_format``. The one choice comes
back as ``text`` and ``tool_use`` blocks with Anthropic's ``stop_reason``. ``usage.input_tokens`` counts the prompt
tokens not read from the prefix cache, ``cache_read_input_tokens`` those that were (their sum is the prompt, what
count_tokens answers). Errors on these routes are in Anthropic's shape (:mod:`frame.server.errors`); streaming is
in :mod:`frame.server.messages_stream`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from frame.errors import FrameUsageError
from frame.server.checks import check_model
from frame.server.deps import get_state
from frame.server.errors import anthropic_body
from frame.server.formatting import named_event, usage
from frame.server.messages_format import message_body, message_usage, stop_reason, tool_use_block
from frame.server.messages_schemas import CountTokensRequest, MessagesRequest, TextBlock, ToolResultBlock, ToolUseBlock
from frame.server.messages_stream import message_events
from frame.server.schemas import ChatCompletionRequest, ChatMessage, FunctionDefinition
from frame.server.state import ServerState
from frame.server.tools import plan_tools, template_tools
from frame.server.turns import event_stream, finish, start_chat, tool_call, translated

router = APIRouter()


def _text(content: str | list[TextBlock] | None) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(block.text for block in content)


def chat_messages(req: CountTokensRequest) -> list[ChatMessage]:
    """The conversation as chat messages."""
    out = [ChatMessage(role="system", content=_text(req.system))] if req.system else []
    for message in req.messages:
        if isinstance(message.content, str):
            out.append(ChatMessage(role=message.role, content=message.content))
            continue
        text = "".join(block.text for block in message.content if isinstance(block, TextBlock))
        calls = [tool_call(b.id, b.name, json.dumps(b.input)) for b in message.content if isinstance(b, ToolUseBlock)]
        results = [ChatMessage(role="tool", tool_call_id=b.tool_use_id, content=_text(b.content))
                   for b in message.content if isinstance(b, ToolResultBlock)]
        out += results
        if text or calls or not results:
            out.append(ChatMessage(role=message.role, content=text or None, tool_calls=calls or None))
    return out


def chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat completions request that answers ``req`` (sampling fields only when it is a MessagesRequest)."""
    functions = [FunctionDefinition(name=t.name, description=t.description, parameters=t.input_schema,
                                    strict=t.strict) for t in req.tools or []]
    choice = req.tool_choice
    if choice is not None and choice.type == "tool" and not choice.name:
        raise FrameUsageError("tool_choice of type tool needs the name of the tool to call.", param="tool_choice.name")
    fmt = req.output_config.format if req.output_config is not None else None
    sampling: dict[str, Any] = {}
    if isinstance(req, MessagesRequest):
        sampling = dict(max_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature,
                        top_p=req.top_p, top_k=req.top_k)
    return translated(chat_messages(req), functions, model=req.model,
                      choice=None if choice is None else {"auto": "auto", "any": "required", "none": "none"}.get(
                          choice.type), named=choice.name if choice is not None and choice.type == "tool" else None,
                      fmt=fmt and fmt.type, schema=fmt and fmt.schema_,
                      parallel_tool_calls=not (choice and choice.disable_parallel_tool_use), **sampling)


@router.post("/v1/messages", response_model=None)
async def create_message(req: MessagesRequest, raw: Request, state: ServerState = Depends(get_state)) -> Response:
    run = await start_chat(chat_request(req), raw, state, prefix="msg")
    message_id = f"msg_{uuid.uuid4().hex}"
    if req.stream:
        details = state.settings.prompt_tokens_details
        events = message_events(message_body(message_id, state.model_name, [], None, None, message_usage(
            run.gen.usage(details))), run, lambda: message_usage(run.gen.usage(details)))
        return event_stream(run, events, lambda body: named_event("error", anthropic_body(body)))
    done = await finish(run, raw)
    if done is None:
        return Response(status_code=499)
    result, turn = done
    content = [{"type": "text", "text": turn.content}] if turn.content or not turn.calls else []
    content += [tool_use_block(call) for call in turn.calls]
    counts = message_usage(usage([result], True))
    return JSONResponse(message_body(message_id, state.model_name, content, *stop_reason(turn), counts))


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, state: ServerState = Depends(get_state)) -> dict[str, int]:
    """The prompt tokens a Messages request with this conversation, system prompt and tools would have."""
    check_model(req.model, state.model_names)
    chat = chat_request(req)
    ids = await state.prompts.chat(chat.messages, True, None, None, template_tools(chat, plan_tools(chat)))
    return {"input_tokens": len(ids)}
