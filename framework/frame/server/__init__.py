"""The OpenAI-compatible HTTP server of ``frame serve``.

:func:`build_app` makes the FastAPI app over one engine client (the engine core in a child process by default);
the request handlers validate, render chat templates and tokenise here, so only checked requests reach the engine.
Names load on first use, so the chat-template worker (``python -m frame.server.render_worker``) stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HttpLimits", "ServerLimits", "ServerSettings", "build_app"]


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from frame.server.app import build_app

        return build_app
    if name in ("HttpLimits", "ServerLimits", "ServerSettings"):
        from frame.server import settings

        return getattr(settings, name)
    raise AttributeError(name)
