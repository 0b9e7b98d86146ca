"""The event stream of ``POST /v1/messages`` with ``stream: true``, in Anthropic's order.

``message_start`` (the message with no content and the prompt's usage); for the text, ``content_block_start``, a
``content_block_delta`` (``text_delta``) per piece and ``content_block_stop``; for each tool call (known once the
turn has ended), ``content_block_start`` (``tool_use`` with an empty input), one ``input_json_delta`` with the
arguments and ``content_block_stop``; then ``message_delta`` (``stop_reason``, ``stop_sequence``, the final
usage) and ``message_stop``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from frame.server.formatting import named_event
from frame.server.messages_format import stop_reason, tool_use_block
from frame.server.turns import ChatRun, TurnEnd, turn_stream


def _event(kind: str, **data: Any) -> str:
    return named_event(kind, {"type": kind, **data})


async def message_events(start: dict[str, Any], run: ChatRun,
                         usage: Callable[[], dict[str, Any]]) -> AsyncIterator[str]:
    """The SSE events of one streamed message; ``start`` is the message as ``message_start`` shows it."""
    yield _event("message_start", message=start)
    index, text_open, end = 0, False, None
    async for piece in turn_stream(run):
        if isinstance(piece, TurnEnd):
            end = piece
            continue
        if not text_open:
            text_open = True
            yield _event("content_block_start", index=index, content_block={"type": "text", "text": ""})
        yield _event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
    if end is None:  # the stream ended without a finish (aborted): nothing more to report
        return
    if not text_open and not end.calls:
        text_open = True
        yield _event("content_block_start", index=index, content_block={"type": "text", "text": ""})
    if text_open:
        yield _event("content_block_stop", index=index)
        index += 1
    for call in end.calls:
        block = tool_use_block(call)
        yield _event("content_block_start", index=index, content_block={**block, "input": {}})
        yield _event("content_block_delta", index=index, delta={"type": "input_json_delta",
                                                                "partial_json": call.arguments})
        yield _event("content_block_stop", index=index)
        index += 1
    reason, sequence = stop_reason(end)
    yield _event("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence}, usage=usage())
    yield _event("message_stop")
