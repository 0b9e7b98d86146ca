"""build_app: the FastAPI app of ``frame serve`` over one engine (child process or in-process thread).

The lifespan starts the engine client while it loads the tokenizer and starts the chat-template workers, then
publishes a :class:`ServerState` on ``app.state.frame`` and an :class:`EngineSupervisor` that watches the engine;
on shutdown it stops them all. Two ASGI middlewares run before routing: :class:`RequestGuard` (body limits,
``Connection: close``, the JSON 500) and, when keys are configured, :class:`ApiKeyMiddleware`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI

from frame.config import EngineConfig
from frame.engine.client import AsyncEngine, EngineClient, EngineDeadError, make_client
from frame.errors import FrameUsageError
from frame.heap import trim_while_serving
from frame.model_source import ModelSource
from frame.server import chat, completions, messages, responses, routes
from frame.server.auth import ApiKeyMiddleware
from frame.server.constraints import ConstraintChecker
from frame.server.errors import install_error_handlers
from frame.server.guard import RequestGuard
from frame.server.metrics import ServerMetrics
from frame.server.openapi import install_openapi
from frame.server.prompts import Prompts, render_init
from frame.server.render_pool import RenderPool
from frame.server.settings import ServerSettings
from frame.server.state import ServerState
from frame.server.supervisor import EngineSupervisor
from frame.summary import startup_summary
from frame.version import __version__

log = logging.getLogger("frame.server")
T = TypeVar("T")


def _cannot_exit(code: int) -> None:
    log.error("the server should exit with status %d, but it was not started by run_server", code)


async def _unless_stopped(app: FastAPI, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None when SIGTERM or Ctrl-C asked the server to stop first: ``work`` (the engine's
    start) is then cancelled, which shuts down what it started, rather than waited for (up to many minutes)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    app.state.stop_starting = lambda: loop.call_soon_threadsafe(stop.set)
    task, stopped = asyncio.ensure_future(work), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        app.state.stop_starting = None
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    log.warning("stopped while starting: the engine was shut down before it was ready")
    return None


def build_app(config: EngineConfig, settings: ServerSettings) -> FastAPI:
    """The app; the engine starts when the app's lifespan starts (uvicorn does that before serving)."""

    async def start_engine() -> EngineClient:
        client = make_client(settings.engine_mode, config)
        try:
            await client.start()
        except BaseException:
            await client.shutdown()
            raise
        return client

    async def start_prompts() -> tuple[Any, RenderPool]:
        source = ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
        tokenizer = await asyncio.to_thread(lambda: source.tokenizer)
        if settings.chat_template is not None:
            tokenizer.chat_template = settings.chat_template
        pool = RenderPool(render_init(tokenizer), settings.tokenizer_workers, settings.tokenize_timeout_s)
        try:
            await pool.start()
        except BaseException:
            await pool.close()
            raise
        return tokenizer, pool

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started = await _unless_stopped(app, asyncio.gather(start_engine(), start_prompts(),
                                                            return_exceptions=True))
        if started is None:  # the server exits at once: should_exit is set
            yield
            return
        if any(isinstance(r, BaseException) for r in started):
            client, prompts = started
            if isinstance(client, EngineClient):
                await client.shutdown()
            if isinstance(prompts, tuple):
                await prompts[1].close()
            err = next(r for r in started if isinstance(r, BaseException))
            if isinstance(err, FrameUsageError):
                # The engine refused the user's mistake (an unknown plugin, a missing model: its process checks
                # them, so this one needs no torch): the sentence and exit status 2, as the CLI's own checks.
                print(f"error: {err}", file=sys.stderr)
                app.state.request_exit(2)
                yield
                return
            if not isinstance(err, EngineDeadError):
                raise err
            # A start that failed for a stated reason (a placement Ray cannot meet, a crash while loading) is that
            # reason, in one line, and exit status 1, not uvicorn's traceback.
            log.error("the engine did not start: %s", err)
            app.state.request_exit(1)
            yield
            return
        app.state.started()
        client, (tokenizer, pool) = started  # type: ignore[misc]
        info = client.info
        log.info("%s", startup_summary(info, config, client.mode))
        stops = sorted({tokenizer.eos_token_id} - {None})
        metrics = ServerMetrics()
        state = ServerState(settings, client, AsyncEngine(client, tokenizer), tokenizer, info, metrics,
                            Prompts(tokenizer, pool, settings),
                            ConstraintChecker(config, info.vocab_size, stops, metrics.grammar_compilations,
                                              settings.grammar_compile_timeout_s, settings.limits.max_choice_chars,
                                              metrics.grammar_seconds))
        app.state.frame = state

        async def restart_engine() -> EngineClient:
            await state.client.shutdown()  # the dead one: its sockets and folder
            return await start_engine()

        supervisor = EngineSupervisor(settings.on_engine_death, settings.max_engine_restarts, restart_engine,
                                      state.replace_engine, lambda code: app.state.request_exit(code),
                                      state.metrics.engine_restarts.inc)
        watcher = asyncio.create_task(supervisor.watch(state.engine), name="engine-supervisor")
        in_flight = state.metrics.registry.get_sample_value
        trimmer = asyncio.create_task(trim_while_serving(lambda: bool(in_flight("frame_server_requests_in_flight"))),
                                      name="heap-trim")
        try:
            yield
        finally:
            trimmer.cancel()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await state.client.shutdown()
            await pool.close()
            state.prompts.close()
            state.constraints.close()
            app.state.frame = None

    app = FastAPI(title="frame", version=__version__, lifespan=lifespan)
    app.state.frame = None
    app.state.request_exit = _cannot_exit
    app.state.started = lambda: None
    app.state.stop_starting = None
    install_error_handlers(app)
    for module in (routes, completions, chat, responses, messages):
        app.include_router(module.router)
    if settings.enable_reset_prefix_cache:
        app.include_router(routes.cache_router)
    install_openapi(app, settings)
    if settings.api_keys:
        app.add_middleware(ApiKeyMiddleware, api_keys=settings.api_keys, salt_by_key=settings.salt_by_key,
                           max_per_key=settings.http.per_key_cap)
    app.add_middleware(RequestGuard, max_body_bytes=settings.http.max_body_bytes,
                       body_timeout_s=settings.http.body_timeout_s,
                       draining=lambda: bool(app.state.frame and app.state.frame.draining),
                       retry_after_s=settings.retry_after_s)
    return app
