"""Engine clients: the engine core in a child process (``mp``) or in a thread (``inproc``), one async interface.

:class:`EngineClient` is the transport (add, abort, stats, health); :class:`AsyncEngine` turns it into per-request
streams of text deltas. Messages are msgspec structs; across processes they travel as msgpack over ZeroMQ.
"""

from __future__ import annotations

from frame.config import EngineConfig
from frame.engine.client.async_engine import AsyncEngine, EngineRejectedError, StreamItem
from frame.engine.client.base import EngineClient, EngineDeadError, RankState

ENGINE_MODES = ("mp", "inproc")


def uses_cores_apart(mode: str, config: EngineConfig) -> bool:
    """Whether the engine cores run as a data-parallel group (several cores, or any core as a Ray actor)."""
    return config.data_parallel_size > 1 or (mode == "mp" and config.distributed_backend == "ray")


def make_client(mode: str, config: EngineConfig) -> EngineClient:
    """The EngineClient for ``mode``: "mp" (child process) or "inproc" (a thread of this process); with
    ``data_parallel_size`` above 1 (or engine cores as Ray actors), a data-parallel client of them."""
    if mode == "inproc" and config.data_parallel_size > 1:
        from frame.engine.client.dp import check_data_parallel

        check_data_parallel(mode, config)
    if uses_cores_apart(mode, config):
        from frame.engine.client.dp import make_dp_client

        return make_dp_client(config)
    if mode == "mp":
        from frame.engine.client.mp import MPEngineClient

        return MPEngineClient(config)
    if mode == "inproc":
        from frame.engine.client.inproc import InprocEngineClient

        return InprocEngineClient(config)
    raise ValueError(f"unknown engine mode {mode!r}; choose one of {', '.join(ENGINE_MODES)}")


__all__ = ["ENGINE_MODES", "AsyncEngine", "EngineClient", "EngineDeadError", "EngineRejectedError", "RankState",
           "StreamItem", "make_client", "uses_cores_apart"]
