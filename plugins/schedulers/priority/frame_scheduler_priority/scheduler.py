"""PriorityScheduler: per-request priority over frame's continuous-batching mechanism."""

from __future__ import annotations

from collections.abc import Iterable

from frame.scheduling import PolicyScheduler
from frame.sequence import Sequence


def importance(seq: Sequence) -> tuple[int, float]:
    """The sort key of the policy: a lower priority value, then an earlier arrival, is more important."""
    return seq.priority, seq.arrival_time


class PriorityScheduler(PolicyScheduler):
    """Serves the most important requests first (``Sequence.priority``; lower is more important, as in vLLM).

    Admission tries waiting sequences by (priority, arrival time), preempted ones included, and stops at the
    first the pool cannot hold, so a less important request never takes the blocks a more important one waits
    for. When the pool runs dry, the least important running sequence is preempted (the largest priority value,
    the latest arrival among equals), even when it already has tokens in this step: the mechanism then takes
    it out of the step and gives its tokens back to the budget.
    """

    def admission_order(self, waiting: list[Sequence]) -> Iterable[Sequence]:
        """Waiting sequences by (priority, arrival time)."""
        return sorted(waiting, key=importance)

    def preemption_victim(self, running: list[Sequence]) -> Sequence:
        """The least important running sequence."""
        return max(running, key=importance)
