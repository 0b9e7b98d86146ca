"""EngineLoop: the busy loop around an EngineCore, shared by the child process and the in-process thread.

It steps the core while it has work and blocks on its input when idle. Messages arrive through ``recv`` and
answers leave through ``send``; the transport (ZeroMQ sockets or thread-safe queues) is the caller's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from frame.engine.core import EngineCore
from frame.engine.mp.messages import (
    AbortRequests,
    AddRequests,
    FromEngine,
    GetStats,
    Outputs,
    Ready,
    Rejected,
    Shutdown,
    StatsReply,
    ToEngine,
)
from frame.errors import FrameUsageError

log = logging.getLogger("frame.engine.loop")

#: How long an idle loop blocks on its input before looking around again (seconds).
IDLE_WAIT_S = 1.0


def ready_message(core: EngineCore, pid: int) -> Ready:
    """What the client needs to know about a freshly built core."""
    return Ready(pid=pid, max_model_len=core.max_model_len, vocab_size=int(core.source.hf_config.vocab_size),
                 num_blocks=core.num_blocks, model_name=core.source.name)


class EngineLoop:
    """Runs one EngineCore: applies client messages between steps and sends every step's outputs."""

    def __init__(self, core: EngineCore, send: Callable[[FromEngine], None]) -> None:
        self.core = core
        self.send = send

    def handle(self, msg: ToEngine) -> bool:
        """Apply one message; False means shut down."""
        if isinstance(msg, AddRequests):
            for req in msg.requests:
                try:
                    self.core.add_request(req)
                except FrameUsageError as err:
                    self.send(Rejected(req.request_id, err.message, err.status, err.code, err.param))
                except ValueError as err:
                    self.send(Rejected(req.request_id, str(err)))
                except Exception:  # one request the core cannot take must not end the loop for every other
                    log.exception("the engine could not add request %s", req.request_id)
                    self.send(Rejected(req.request_id, "The engine could not add this request.", 500,
                                       "internal_error"))
        elif isinstance(msg, AbortRequests):
            outputs = self.core.abort(msg.request_ids)
            if outputs:
                self.send(Outputs(outputs))
        elif isinstance(msg, GetStats):
            self.send(StatsReply(msg.call_id, self.core.stats()))
        elif isinstance(msg, Shutdown):
            return False
        return True

    def run(self, recv: Callable[[float], list[ToEngine]]) -> None:
        """Loop until a Shutdown message. ``recv(timeout)`` returns the messages waiting (maybe none). The core's
        model workers are stopped when the loop ends, however it ends (a dead worker raises out of a step)."""
        try:
            self._run(recv)
        finally:
            self.core.shutdown()

    def _run(self, recv: Callable[[float], list[ToEngine]]) -> None:
        while True:
            busy = self.core.has_unfinished()
            for msg in recv(0.0 if busy else IDLE_WAIT_S):
                if not self.handle(msg):
                    log.info("engine loop shutting down")
                    return
            if self.core.has_unfinished():
                outputs = self.core.step()
                if outputs:
                    self.send(Outputs(outputs))
