"""The Messages API's objects: the message, its ``tool_use`` blocks, its stop reason and its usage."""

from __future__ import annotations

import json
import uuid
from typing import Any

from frame.interfaces.tool_parser import ToolCall
from frame.server.turns import TurnEnd


def stop_reason(turn: TurnEnd) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a finished turn."""
    if turn.finish_reason == "tool_calls":
        return "tool_use", None
    if turn.finish_reason == "length":
        return "max_tokens", None
    if isinstance(turn.stop_reason, str):
        return "stop_sequence", turn.stop_reason
    return "end_turn", None


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": call.name,
            "input": json.loads(call.arguments)}


def message_usage(counts: dict[str, Any]) -> dict[str, Any]:
    """Chat's usage counts in Anthropic's names (cached prompt tokens apart, as Anthropic counts them)."""
    cached = counts.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {"input_tokens": counts["prompt_tokens"] - cached, "output_tokens": counts["completion_tokens"],
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def message_body(message_id: str, model: str, content: list[dict[str, Any]], reason: str | None,
                 sequence: str | None, counts: dict[str, Any]) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": counts}
