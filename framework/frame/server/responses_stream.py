"""The event stream of ``POST /v1/responses`` with ``stream: true``, in OpenAI's documented order.

``response.created``, ``response.in_progress``; for the text: ``response.output_item.added`` (the message),
``response.content_part.added``, ``response.output_text.delta`` per piece, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; for each function call (known once the turn has
ended): ``response.output_item.added``, ``response.function_call_arguments.delta`` and ``.done``,
``response.output_item.done``; last ``response.completed`` (or ``response.incomplete``) with the whole response
and its usage. Every event carries its ``sequence_number``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from frame.server.formatting import named_event
from frame.server.responses_format import ResponseContext, function_call_item, message_item, output_items
from frame.server.turns import ChatRun, TurnEnd, turn_stream


async def response_events(ctx: ResponseContext, run: ChatRun, usage: Callable[[], dict[str, Any]],
                          keep: Callable[[TurnEnd, list[str]], None]) -> AsyncIterator[str]:
    """The SSE events of one streamed response; ``keep`` stores the finished turn (with its call ids)."""
    seq = 0

    def event(kind: str, **data: Any) -> str:
        nonlocal seq
        seq += 1
        return named_event(kind, {"type": kind, "sequence_number": seq - 1, **data})

    yield event("response.created", response=ctx.body(None, [], None))
    yield event("response.in_progress", response=ctx.body(None, [], None))
    message_id, text, end = f"msg_{uuid.uuid4().hex}", None, None
    place = {"item_id": message_id, "output_index": 0}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}

    def opening() -> list[str]:
        return [event("response.output_item.added", output_index=0, item=message_item(None, "in_progress", message_id)),
                event("response.content_part.added", **place, content_index=0, part=part)]

    async for piece in turn_stream(run):
        if isinstance(piece, TurnEnd):
            end = piece
            continue
        if text is None:
            text = ""
            for opened in opening():
                yield opened
        text += piece
        yield event("response.output_text.delta", **place, content_index=0, delta=piece, logprobs=[])
    if end is None:  # the stream ended without a finish (aborted): nothing more to report
        return
    if text is None and (end.content is not None or not end.calls):
        text = ""
        for opened in opening():
            yield opened
    if text is not None:
        yield event("response.output_text.done", **place, content_index=0, text=text, logprobs=[])
        yield event("response.content_part.done", **place, content_index=0, part={**part, "text": text})
        yield event("response.output_item.done", output_index=0, item=message_item(text, "completed", message_id))
    call_ids = [f"call_{uuid.uuid4().hex[:24]}" for _ in end.calls]
    first = 0 if text is None else 1
    for index, (call, call_id) in enumerate(zip(end.calls, call_ids, strict=True), start=first):
        item = function_call_item(call.name, call.arguments, call_id, "completed")
        where = {"item_id": item["id"], "output_index": index}
        yield event("response.output_item.added", output_index=index, item={**item, "arguments": "",
                                                                            "status": "in_progress"})
        yield event("response.function_call_arguments.delta", **where, delta=call.arguments)
        yield event("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments)
        yield event("response.output_item.done", output_index=index, item=item)
    keep(end, call_ids)
    final = ctx.body(end.finish_reason, _with_message_id(output_items(end, call_ids), message_id), usage())
    yield event("response.completed" if final["status"] == "completed" else "response.incomplete", response=final)


def _with_message_id(items: list[dict[str, Any]], message_id: str) -> list[dict[str, Any]]:
    """The final output with the streamed message's id, so the items match the ones the events announced."""
    return [{**item, "id": message_id} if item["type"] == "message" else item for item in items]
