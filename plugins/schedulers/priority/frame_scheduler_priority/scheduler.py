"""PriorityPolicy: per-request priority, for frame's continuous-batching mechanism."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from frame.interfaces.scheduler import PrefixLookup, SchedulingPolicy
from frame.sequence import Sequence


def importance(seq: Sequence) -> tuple[int, float]:
    """The sort key of the policy: a lower priority value, then an earlier arrival, is more important."""
    return seq.priority, seq.arrival_time


class PriorityPolicy(SchedulingPolicy):
    """Serves the most important requests first (``Sequence.priority``; lower is more important, as in vLLM).

    Admission tries waiting requests by (priority, arrival time), preempted ones included, and the engine stops at
    the first the pool cannot hold, so a less important request never takes the blocks a more important one
    waits for. When the pool runs dry, the least important running request is preempted (the largest priority
    value, the latest arrival among equals), even when it already has tokens in this step: the engine then takes
    it out of the step and gives its tokens back to the budget.
    """

    def admission_order(self, waiting: Seq[Sequence], prefix: PrefixLookup) -> Iterable[Sequence]:
        """Waiting requests by (priority, arrival time)."""
        return sorted(waiting, key=importance)

    def preemption_victim(self, running: Seq[Sequence]) -> Sequence:
        """The least important running request."""
        return max(running, key=importance)
