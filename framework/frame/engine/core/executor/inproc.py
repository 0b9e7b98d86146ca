"""InProcExecutor: the one model worker runs in the engine core's own process (one device, no parallelism)."""

from __future__ import annotations

from frame.engine.core.executor.base import Executor
from frame.engine.wire.plan import RunnerOutput, SchedulerOutput
from frame.engine.worker.model_worker import Worker


class InProcExecutor(Executor):
    """Calls a :class:`~frame.engine.worker.model_worker.Worker` directly; the plan never leaves the process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def available_kv_blocks(self) -> int:
        return self.worker.available_kv_blocks()

    def allocate_kv(self, num_blocks: int) -> list[int]:
        return self.worker.allocate_kv(num_blocks)

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        return self.worker.execute(plan)

    def check_health(self) -> None:
        """A worker in this process lives as long as the engine does."""

    def shutdown(self) -> None:
        """Nothing to stop: the worker goes with the engine."""

    @property
    def bytes_per_block(self) -> int:
        return self.worker.runner.bytes_per_block
