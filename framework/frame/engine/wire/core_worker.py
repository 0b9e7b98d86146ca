"""What the executor and its worker processes say to each other: tagged msgspec values over ZeroMQ, never pickle."""

from __future__ import annotations

from typing import Union

import msgspec

from frame.engine.wire.plan import RunnerOutput, SchedulerOutput


# -- executor -> worker -------------------------------------------------------------------------------------
class AllocateKV(msgspec.Struct, tag="allocate_kv"):
    """Allocate a KV pool of ``num_blocks`` blocks (the same count on every rank)."""

    num_blocks: int


class RunStep(msgspec.Struct, tag="step"):
    """Run one step of the plan; the driver rank answers with :class:`StepDone`."""

    plan: SchedulerOutput


class StopWorker(msgspec.Struct, tag="stop"):
    """Leave the loop and exit."""


# -- worker -> executor -------------------------------------------------------------------------------------
class WorkerReady(msgspec.Struct, tag="ready"):
    """The worker built its shard of the model; it could hold ``kv_blocks`` blocks of ``bytes_per_block``."""

    rank: int
    kv_blocks: int
    bytes_per_block: int


class KVAllocated(msgspec.Struct, tag="kv_allocated"):
    rank: int
    #: The batch sizes this rank recorded decode steps for (empty: its decode steps run eagerly).
    decode_graphs: list[int] = []


class StepDone(msgspec.Struct, tag="step_done"):
    """The driver rank's output of one step."""

    output: RunnerOutput


class WorkerFailed(msgspec.Struct, tag="failed"):
    """The worker hit an error (while starting or in a step) and exits after sending this."""

    rank: int
    message: str


ToWorker = Union[AllocateKV, RunStep, StopWorker]  # noqa: UP007 - msgspec needs a typing Union
FromWorker = Union[WorkerReady, KVAllocated, StepDone, WorkerFailed]  # noqa: UP007
