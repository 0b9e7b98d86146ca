"""build_app: the FastAPI app of ``frame serve`` over one engine (child process or in-process thread).

The lifespan starts the engine client and loads the tokenizer concurrently, then publishes a
:class:`ServerState` on ``app.state.frame``; on shutdown it stops the engine. An ASGI middleware guards every
route but ``/health`` with the API key, before the body is read.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from frame.config import EngineConfig
from frame.engine.mp import AsyncEngine, make_client
from frame.model_source import ModelSource
from frame.server import chat, completions, routes
from frame.server.errors import error_body, install_error_handlers
from frame.server.metrics import ServerMetrics
from frame.server.settings import ServerSettings
from frame.server.state import ServerState
from frame.version import __version__

log = logging.getLogger("frame.server")

#: Paths served without an API key.
OPEN_PATHS = frozenset({"/health"})


class ApiKeyMiddleware:
    """Refuses (401, OpenAI shape) any request but OPEN_PATHS without ``Authorization: Bearer <key>``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        why = "No API key was sent" if not given else "The API key is wrong"
        body = json.dumps(error_body(f"{why}; send 'Authorization: Bearer <key>'.", 401, "invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def build_app(config: EngineConfig, settings: ServerSettings) -> FastAPI:
    """The app; the engine starts when the app's lifespan starts (uvicorn does that before serving)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = make_client(settings.engine_mode, config)
        source = ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
        try:
            info, tokenizer = await asyncio.gather(client.start(), asyncio.to_thread(lambda: source.tokenizer))
        except BaseException:
            await client.shutdown()
            raise
        log.info("engine ready (%s mode, pid %s): %s, max_model_len %d, %d KV blocks", client.mode, client.pid,
                 info.model_name, info.max_model_len, info.num_blocks)
        app.state.frame = ServerState(settings, client, AsyncEngine(client, tokenizer), tokenizer, info,
                                      ServerMetrics())
        try:
            yield
        finally:
            await client.shutdown()
            app.state.frame = None

    app = FastAPI(title="frame", version=__version__, lifespan=lifespan)
    app.state.frame = None
    install_error_handlers(app)
    for module in (routes, completions, chat):
        app.include_router(module.router)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=settings.api_key)
    return app
