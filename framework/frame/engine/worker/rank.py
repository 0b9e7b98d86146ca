"""Building the worker of one tensor-parallel rank: its platform share, its process group, its shard of the model.

Shared by the worker processes of :class:`~frame.engine.core.executor.multiproc.MultiprocExecutor` and the Ray actors
of :class:`~frame.engine.core.executor.ray.RayExecutor`: resolve the plugins, let the platform pick this rank's device
or share of the host (:meth:`~frame.interfaces.platform.Platform.for_rank`), join the torch.distributed group on
the platform's backend (gloo on CPUs, NCCL/RCCL on GPUs), then build the
:class:`~frame.engine.worker.model_worker.Worker`.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from frame.config import EngineConfig
from frame.engine.process import CORES_ON_NODE_ENV
from frame.engine.selection import select
from frame.engine.worker.model_worker import Worker
from frame.parallel import Communicator, ParallelContext
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry

#: How long a collective may wait for the other ranks before it fails (a dead peer is normally noticed sooner,
#: by the executor, which then stops every worker).
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)


def placement_rank(config: EngineConfig, tp_rank: int = 0) -> tuple[int, int]:
    """``(rank, world_size)`` the platform places a model worker by (its device, or its share of the CPU cores).

    With data parallelism over worker processes on one host, every core's tensor-parallel ranks take the next
    devices (core ``d`` rank ``t``: ``d * tp + t`` of ``dp * tp``). Ray gives each actor its own devices, so
    there the tensor-parallel rank alone picks the device, and the world is every worker of the engine cores Ray
    placed on this node (what a CPU platform divides the node's cores by)."""
    tp = config.tensor_parallel_size
    if config.distributed_backend == "ray":
        return tp_rank, tp * max(1, int(os.environ.get(CORES_ON_NODE_ENV) or 1))
    if config.data_parallel_size == 1:
        return tp_rank, tp
    return config.data_parallel_rank * tp + tp_rank, config.data_parallel_size * tp


def build_rank_worker(config: EngineConfig, max_model_len: int, rank: int, world_size: int,
                      init_method: str) -> Worker:
    """This rank's worker, its process group joined (``init_method``: ``tcp://host:port`` of the rendezvous)."""
    hooks = PluginHooks(PluginRegistry())
    selection = select(config, hooks)
    selection.platform.for_rank(*placement_rank(config, rank))
    dist.init_process_group(selection.platform.distributed_backend, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    parallel = ParallelContext(rank, world_size, Communicator(dist.group.WORLD))
    return Worker(config, max_model_len, parallel=parallel, registry=hooks.registry, selection=selection)
