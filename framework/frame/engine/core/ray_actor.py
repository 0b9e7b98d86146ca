"""EngineCoreActor: the body of one data-parallel rank's Ray actor, an engine core and its loop in a thread.

The client (:mod:`frame.engine.client.ray`) wraps it with ``ray.remote`` and places it; what crosses is msgpack
bytes of the wire's messages. A threaded actor may run two calls at once, so numbered messages are put back in
order before the loop sees them; the client long-polls for what the core sends back.
"""

from __future__ import annotations

import logging
import queue
import threading

from frame.config import EngineConfig
from frame.engine.wire.client_core import Failed, FromEngine, Ready, ToEngine
from frame.engine.wire.codec import decode, encode

log = logging.getLogger("frame.engine.ray")


class EngineCoreActor:
    """The body of one rank's actor (wrapped by ``ray.remote``): an engine core and its loop in a thread."""

    def __init__(self, config_json: str) -> None:
        self._inbox: queue.SimpleQueue[ToEngine] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._held: dict[int, bytes] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._greeting: bytes | None = None
        self._built = threading.Event()
        threading.Thread(target=self._main, args=(config_json,), name="frame-engine", daemon=True).start()

    def _main(self, config_json: str) -> None:
        from frame.engine.core.loop import drain, serve_core

        try:
            serve_core(EngineConfig.model_validate_json(config_json), self._post,
                       lambda timeout_s: drain(self._inbox, timeout_s))
        except Exception as err:  # the client must hear why, at start or later
            log.exception("engine core failed")
            self._post(Failed(f"{type(err).__name__}: {err}"))

    def _post(self, msg: FromEngine) -> None:
        if not self._built.is_set() and isinstance(msg, Ready | Failed):
            self._greeting = encode(msg)
            self._built.set()
        else:
            self._outbox.put(encode(msg))

    def ready(self) -> bytes:
        """The core's Ready (or Failed) message, once it is built."""
        self._built.wait()
        assert self._greeting is not None
        return self._greeting

    def send(self, seq: int, data: bytes) -> None:
        """Message ``seq`` (numbered from 0 by each client) for the loop; applied in number order."""
        with self._lock:
            self._held[seq] = data
            while self._next in self._held:
                self._inbox.put(decode(self._held.pop(self._next), ToEngine))
                self._next += 1

    def poll(self, timeout_s: float) -> list[bytes]:
        """What the core sent since the last poll, waiting up to ``timeout_s`` for something."""
        from frame.engine.core.loop import drain

        return drain(self._outbox, timeout_s)
