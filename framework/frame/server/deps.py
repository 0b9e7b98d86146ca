"""Shared pieces of the route modules: the state lookup and the checks every generation request makes."""

from __future__ import annotations

import uuid

from fastapi import Request

from frame.errors import FrameUsageError
from frame.server.auth import TENANT_SCOPE_KEY, effective_salt
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


def cache_salt(request: Request, request_salt: str | None) -> str | None:
    """The salt of a request's prefix-cache entries: its key's digest (when keys are tenants) and its own salt."""
    return effective_salt(request_salt, request.scope.get(TENANT_SCOPE_KEY))


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
