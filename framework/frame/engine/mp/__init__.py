"""Engine clients: the engine core in a child process (``mp``) or in a thread (``inproc``), one async interface.

:class:`EngineClient` is the transport (add, abort, stats, health); :class:`AsyncEngine` turns it into per-request
streams of text deltas. Messages are msgspec structs; across processes they travel as msgpack over ZeroMQ.
"""

from __future__ import annotations

from frame.config import EngineConfig
from frame.engine.mp.async_engine import AsyncEngine, EngineRejectedError, StreamItem
from frame.engine.mp.client import EngineClient, EngineDeadError

ENGINE_MODES = ("mp", "inproc")


def make_client(mode: str, config: EngineConfig) -> EngineClient:
    """The EngineClient for ``mode``: "mp" (child process) or "inproc" (a thread of this process)."""
    if mode == "mp":
        from frame.engine.mp.mp_client import MPEngineClient

        return MPEngineClient(config)
    if mode == "inproc":
        from frame.engine.mp.inproc_client import InprocEngineClient

        return InprocEngineClient(config)
    raise ValueError(f"unknown engine mode {mode!r}; choose one of {', '.join(ENGINE_MODES)}")


__all__ = ["ENGINE_MODES", "AsyncEngine", "EngineClient", "EngineDeadError", "EngineRejectedError", "StreamItem",
           "make_client"]
