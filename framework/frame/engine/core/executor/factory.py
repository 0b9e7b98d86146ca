"""Which executor an engine config asks for, built."""

from __future__ import annotations

from frame.config import EngineConfig
from frame.engine.core.executor.base import Executor
from frame.engine.core.executor.inproc import InProcExecutor
from frame.engine.selection import Selection
from frame.engine.worker.model_worker import Worker
from frame.model_source import ModelSource
from frame.plugins.registry import PluginRegistry


def make_executor(config: EngineConfig, max_model_len: int, registry: PluginRegistry, source: ModelSource,
                  selection: Selection) -> Executor:
    """In-process for one rank; worker processes (or Ray actors) for tensor parallelism."""
    if config.distributed_backend == "ray" and config.tensor_parallel_size > 1:
        from frame.engine.core.executor.ray import RayExecutor  # Ray is an optional dependency

        return RayExecutor(config, max_model_len, config.tensor_parallel_size, selection.platform_name)
    if config.tensor_parallel_size > 1:
        from frame.engine.core.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config, max_model_len, config.tensor_parallel_size)
    return InProcExecutor(Worker(config, max_model_len, registry=registry, source=source, selection=selection))
