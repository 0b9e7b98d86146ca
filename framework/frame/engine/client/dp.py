"""Data parallelism: several engine cores behind one client, a router plugin placing each request.

:class:`DataParallelClient` holds one engine client per rank: a child process each
(:class:`~frame.engine.client.mp.MPEngineClient`) or, with ``distributed_backend: ray``, a Ray actor each
(:mod:`frame.engine.client.ray`). :class:`~frame.engine.client.sync.DataParallelEngine` drives one from synchronous
code (the offline ``LLM``, experiments).
"""

from __future__ import annotations

import importlib.util

from frame.config import EngineConfig
from frame.engine.client.base import EngineClient
from frame.engine.client.data_parallel import DataParallelClient, RankFactory, make_router, sum_stats
from frame.errors import ConfigError
from frame.interfaces.router import Router


def check_data_parallel(mode: str, config: EngineConfig) -> Router:
    """Refuse, in one sentence naming the fix, engine forms that cannot work: several cores in the server's own
    thread, Ray without Ray installed, an unknown router or a bad router option. Returns the router."""
    if mode == "inproc" and config.data_parallel_size > 1:
        raise ConfigError("--engine inproc runs one engine core in the server's thread; drop --engine inproc to "
                          f"serve with --data-parallel-size {config.data_parallel_size}.", param="engine")
    if config.distributed_backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("distributed_backend ray needs Ray, which is not installed; pip install "
                          "'frame-engine[ray]', or use distributed_backend mp.", param="distributed_backend")
    return make_router(config)


def make_dp_client(config: EngineConfig) -> DataParallelClient:
    """The client of ``config.data_parallel_size`` engine cores: child processes, or (``distributed_backend:
    ray``) Ray actors; its router resolved (an unknown router or a bad router option fails here, before any core
    starts)."""
    router = check_data_parallel("mp", config)
    if config.distributed_backend == "ray":
        from frame.engine.client.ray import RaySession  # Ray is an optional dependency

        session = RaySession(config)
        return DataParallelClient(config, session.client, router, on_close=session.close)
    from frame.engine.client.mp import MPEngineClient

    def child_process(rank_config: EngineConfig, previous: EngineClient | None) -> EngineClient:
        return MPEngineClient(rank_config)

    return DataParallelClient(config, child_process, router)


__all__ = ["DataParallelClient", "RankFactory", "check_data_parallel", "make_dp_client", "make_router", "sum_stats"]
