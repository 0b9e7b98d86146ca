"""Shared pieces of the route modules: the state lookup and the checks every generation request makes."""

from __future__ import annotations

import uuid

from fastapi import Request

from frame.errors import FrameUsageError
from frame.server.checks import check_token_ids
from frame.server.errors import ServerError
from frame.server.state import ServerState


def get_state(request: Request) -> ServerState:
    state: ServerState | None = getattr(request.app.state, "frame", None)
    if state is None:
        raise ServerError("The server is starting; retry shortly.", status=503, code="starting",
                          headers={"Retry-After": "1"})
    return state


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def tokenize_text(state: ServerState, text: str, param: str = "prompt") -> list[int]:
    if not text:
        raise FrameUsageError(f"{param} is empty; send at least one character.", param=param)
    return list(state.tokenizer(text).input_ids)


def check_ids(state: ServerState, ids: list[int], param: str = "prompt") -> list[int]:
    if not ids:
        raise FrameUsageError(f"{param} is empty; send at least one token.", param=param)
    check_token_ids(ids, state.info.vocab_size, param)
    return ids


def default_max_tokens(state: ServerState, longest_prompt: int) -> int:
    """When a request sets no max_tokens: the rest of the context, within the server's limit."""
    room = max(state.info.max_model_len - longest_prompt, 1)
    limit = state.settings.limits.max_tokens
    return min(room, limit) if limit else room
