"""run_server: uvicorn around the app, with a graceful drain on SIGTERM.

On SIGTERM (or Ctrl-C) the server marks itself draining: ``/health`` turns 503 and new generation requests get
503 with Retry-After, uvicorn stops accepting connections, and requests already running finish for up to
``drain_timeout_s`` seconds before they are cancelled (which aborts them in the engine). Then the engine stops.
"""

from __future__ import annotations

import logging
from types import FrameType

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("frame.server")


class DrainingServer(uvicorn.Server):
    """A uvicorn server that flags the app as draining when asked to exit."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self.app.state, "frame", None)
        if state is not None and not state.draining:
            state.draining = True
            log.warning("draining: %d request(s) in flight, up to %.0f s", state.engine.num_open,
                        self.config.timeout_graceful_shutdown or 0)
        super().handle_exit(sig, frame)


def server_for(app: FastAPI, host: str, port: int, drain_timeout_s: float, log_level: str = "info") -> DrainingServer:
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_timeout_s,
                            timeout_keep_alive=5, access_log=False)
    return DrainingServer(config, app)


def run_server(app: FastAPI, host: str, port: int, drain_timeout_s: float, log_level: str = "info") -> None:
    """Serve until SIGTERM or Ctrl-C; blocks."""
    server_for(app, host, port, drain_timeout_s, log_level).run()
