"""The OpenAI-compatible HTTP server of ``frame serve``.

:func:`build_app` makes the FastAPI app over one engine client (the engine core in a child process by default);
the request handlers validate, apply chat templates and tokenise here, so only checked requests reach the engine.
"""

from frame.server.app import build_app
from frame.server.settings import ServerLimits, ServerSettings

__all__ = ["ServerLimits", "ServerSettings", "build_app"]
