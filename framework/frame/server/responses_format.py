"""The Responses API's objects: the response (in every state a stream reports), its output items, its usage."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from frame.server.responses_schemas import ResponsesRequest
from frame.server.turns import TurnEnd


@dataclass(frozen=True)
class ResponseContext:
    """What every form of one response repeats: its id, creation time, the request and the model's name."""

    response_id: str
    created_at: int
    req: ResponsesRequest
    model: str

    def body(self, finish_reason: str | None, output: list[dict[str, Any]],
             usage: dict[str, Any] | None) -> dict[str, Any]:
        """The response object: ``in_progress`` while ``finish_reason`` is None, ``incomplete`` when the output
        was cut (``max_output_tokens``) or aborted, else ``completed``."""
        req = self.req
        status = "in_progress" if finish_reason is None else \
            "incomplete" if finish_reason in ("length", "abort") else "completed"
        incomplete = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        text_format = fmt.model_dump(mode="json", by_alias=True, exclude_none=True) if fmt else {"type": "text"}
        choice: Any = req.tool_choice.model_dump() if req.tool_choice is not None and not isinstance(
            req.tool_choice, str) else (req.tool_choice or "auto")
        return {"id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
                "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
                "max_output_tokens": req.max_output_tokens, "model": self.model, "output": output,
                "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
                "reasoning": {"effort": None, "summary": None}, "store": req.store is not False,
                "temperature": 1.0 if req.temperature is None else req.temperature,
                "text": {"format": text_format}, "tool_choice": choice,
                "tools": [t.model_dump(mode="json", exclude_none=True) for t in req.tools or []],
                "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": req.truncation or "disabled",
                "usage": usage, "metadata": req.metadata or {}, "user": req.user}


def output_items(turn: TurnEnd, call_ids: list[str]) -> list[dict[str, Any]]:
    """A turn's output items: its message (unless it is only calls), then its function calls."""
    items: list[dict[str, Any]] = []
    if turn.content is not None or not turn.calls:
        items.append(message_item(turn.content or "", "completed"))
    items += [function_call_item(call.name, call.arguments, call_id, "completed")
              for call, call_id in zip(turn.calls, call_ids, strict=True)]
    return items


def message_item(text: str | None, status: str, item_id: str | None = None) -> dict[str, Any]:
    """An output message; ``text`` None: not started (no content part yet)."""
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id or f"msg_{uuid.uuid4().hex}", "status": status, "role": "assistant",
            "content": content}


def function_call_item(name: str, arguments: str, call_id: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id.removeprefix('call_')}", "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def response_usage(counts: dict[str, Any]) -> dict[str, Any]:
    """Chat's usage counts in the Responses API's names."""
    return {"input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": counts.get("prompt_tokens_details", {}).get("cached_tokens", 0)},
            "output_tokens": counts["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"]}


