"""Executor: how the engine core drives its model workers, whatever process (or machine) they live in.

Three forms behind one interface: :class:`~frame.engine.core.executor.inproc.InProcExecutor` (one worker in the
engine core's own process: one device, tests, the offline API), :class:`~frame.engine.core.executor.multiproc.
MultiprocExecutor` (one worker process per tensor-parallel rank, the plan broadcast as msgpack over ZeroMQ, a
torch.distributed group between the workers) and :class:`~frame.engine.core.executor.ray.RayExecutor` (the same
workers as Ray actors). The engine core only calls what is declared here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from frame.engine.wire.plan import RunnerOutput, SchedulerOutput


class WorkerDiedError(RuntimeError):
    """A model worker is gone (killed, crashed); the engine cannot step any more."""


class Executor(ABC):
    """Owns the model workers of one engine core: their start, KV pool, every step, their end."""

    #: Tensor-parallel ranks this executor drives.
    world_size: int = 1

    @abstractmethod
    def available_kv_blocks(self) -> int:
        """The KV blocks every rank could hold (the smallest rank's answer), before :meth:`allocate_kv`."""

    @abstractmethod
    def allocate_kv(self, num_blocks: int) -> list[int]:
        """Allocate a pool of ``num_blocks`` blocks on every rank (each for its own KV heads); the batch sizes the
        driver rank recorded decode steps for (empty where they run eagerly)."""

    @abstractmethod
    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        """Run one step on every rank; the driver rank's output. Raises :class:`WorkerDiedError` when a worker
        is gone (within the executor's liveness timeout, never hanging)."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise :class:`WorkerDiedError` when a worker is gone; cheap enough to call between steps."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker and release their resources. Idempotent."""

    @property
    def bytes_per_block(self) -> int:
        """KV bytes one block takes on the driver rank (for reports)."""
        return 0
