"""InprocEngineClient: the engine core in a thread of this process, with the same interface as the child process.

The engine thread builds the core and runs the same :class:`EngineLoop`; messages reach it through a queue and
come back to the event loop with ``call_soon_threadsafe``. Torch releases the GIL in its kernels, so the event loop
keeps serving HTTP while a step runs.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading

from frame.config import EngineConfig
from frame.engine.client.base import EngineClient
from frame.engine.wire.client_core import FromEngine, Shutdown, ToEngine

log = logging.getLogger("frame.engine.inproc")


class InprocEngineClient(EngineClient):
    """Runs the engine core in a background thread (``frame serve --engine inproc``)."""

    mode = "inproc"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config
        self._inbox: queue.SimpleQueue[ToEngine] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _launch(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._main, name="frame-engine", daemon=True)
        self._thread.start()

    def _post(self, msg: FromEngine) -> None:
        assert self._loop is not None
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._dispatch, msg)

    def _main(self) -> None:
        from frame.engine.core.loop import drain, serve_core

        try:
            serve_core(self.config, self._post, lambda timeout_s: drain(self._inbox, timeout_s))
        except Exception as err:  # the loop's death must reach every waiting request
            log.exception("engine thread failed")
            reason = f"the engine thread failed: {type(err).__name__}: {err}"
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._die, reason)

    def _send(self, msg: ToEngine) -> None:
        self._inbox.put(msg)

    async def shutdown(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._inbox.put(Shutdown())
            await asyncio.to_thread(self._thread.join, 10.0)
        if self.dead_reason is None:
            self.dead_reason = "the engine was shut down"
