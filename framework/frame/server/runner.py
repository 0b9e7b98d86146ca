"""run_server: uvicorn around the app, with a graceful drain on SIGTERM and an exit status for supervisors.

On SIGTERM (or Ctrl-C) the server drains: ``/health`` turns 503, it keeps accepting connections but answers new
generation requests 503 (OpenAI shape, ``Retry-After``), and requests already running finish for up to
``drain_timeout_s`` seconds. Those still running then end the way every failed request ends (the error event
and ``[DONE]`` for a stream, a 503 for a whole response), and uvicorn shuts down; the engine stops last. A second
signal skips the rest of the drain. While the engine is still starting there is nothing to drain: a signal stops
the start (``app.state.stop_starting``, set by the app's lifespan) and the server exits.

The engine supervisor calls ``app.state.request_exit(code)`` when the server must end for a supervisor outside
to restart it; :func:`run_server` returns that code.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from frame.listen import bind_socket
from frame.server.connection import protocol_class
from frame.server.errors import ServerError
from frame.server.settings import HttpLimits

log = logging.getLogger("frame.server")
#: Seconds after the drain's end for the ended requests to write their last bytes before uvicorn cancels them.
FINAL_WRITE_S = 5.0
_POLL_S = 0.1


def drain_error() -> ServerError:
    return ServerError("The server is shutting down and ran out of time for this request; retry it on another "
                       "instance.", status=503, code="server_draining", headers={"Retry-After": "1"})


class DrainingServer(uvicorn.Server):
    """A uvicorn server that drains before it exits and can be asked to exit with a status."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.app, self.drain_timeout_s = app, drain_timeout_s
        self.exit_code = 0
        #: The first SIGTERM or SIGINT that asked the server to stop (None: none did).
        self.stopped_by: int | None = None
        self._draining_since: float | None = None
        self._signals: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        app.state.request_exit = self.request_exit

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def request_exit(self, code: int) -> None:
        """End the server (no drain: called when the engine is gone) with exit status ``code``."""
        self.exit_code = code
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        state = getattr(self.app.state, "frame", None)
        if self._draining_since is not None or state is None or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal, or nothing to drain: exit now
            stop_starting = getattr(self.app.state, "stop_starting", None)
            if stop_starting is not None:  # still starting: stop the engine's start instead of waiting for it
                stop_starting()
            return
        self._signals.append(sig)
        self._draining_since = time.monotonic()
        state.draining = True
        log.warning("draining: %d request(s) in flight, up to %.0f s", state.engine.num_open, self.drain_timeout_s)
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        state = self.app.state.frame
        deadline = time.monotonic() + self.drain_timeout_s
        try:
            while state.engine.num_open and time.monotonic() < deadline and not self.should_exit:
                await asyncio.sleep(_POLL_S)
            if state.engine.num_open:
                log.warning("drain timed out: ending %d request(s)", state.engine.num_open)
                state.engine.fail_all(drain_error)
                await asyncio.sleep(_POLL_S)
        finally:
            for sig in self._signals:  # exits the way uvicorn does: the signal is raised again once shut down
                super().handle_exit(sig, None)


def server_for(app: FastAPI, host: str, port: int, drain_timeout_s: float, log_level: str = "info",
               http: HttpLimits | None = None) -> DrainingServer:
    http = http or HttpLimits()
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=protocol_class(http),
                            timeout_graceful_shutdown=int(FINAL_WRITE_S), timeout_keep_alive=int(http.keep_alive_s),
                            backlog=min(2048, http.max_connections), access_log=False, ws="none",
                            h11_max_incomplete_event_size=http.max_header_bytes)
    return DrainingServer(config, app, drain_timeout_s)


def _quiet_until_started(app: FastAPI) -> None:
    """Hold back uvicorn's informational lines until the engine is ready (``app.state.started``): a start the
    engine refuses on a user's mistake then prints that one sentence alone."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    level = uvicorn_log.level
    uvicorn_log.setLevel(max(level, logging.WARNING))
    app.state.started = lambda: uvicorn_log.setLevel(level)


def run_server(app: FastAPI, host: str, port: int, drain_timeout_s: float, log_level: str = "info",
               http: HttpLimits | None = None, sock: socket.socket | None = None) -> int:
    """Serve until SIGTERM or Ctrl-C (or the supervisor's request to exit); blocks; returns the exit status.
    ``sock`` is the address already bound by :func:`bind_socket` (bound here when None)."""
    server = server_for(app, host, port, drain_timeout_s, log_level, http)
    _quiet_until_started(app)
    server.run(sockets=[sock or bind_socket(host, port)])
    if server.exit_code == 0 and server.stopped_by is not None:
        # uvicorn raises the signal again once shut down, but a SIGINT that reaches asyncio's runner while the
        # server's task is finishing cancels nothing and is lost: the status says the signal either way.
        return 128 + server.stopped_by
    return server.exit_code
