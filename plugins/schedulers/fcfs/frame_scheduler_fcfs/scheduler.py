"""FcfsScheduler: vLLM's default policy over frame's continuous-batching mechanism."""

from __future__ import annotations

from collections.abc import Iterable

from frame.scheduling import PolicyScheduler
from frame.sequence import Sequence


class FcfsScheduler(PolicyScheduler):
    """First come, first served.

    Admission follows the waiting queue: preempted sequences at its front (the most recently preempted first,
    as in vLLM), then new sequences in arrival order; admission stops at the first one the pool cannot hold.
    When the pool runs dry, the most recently admitted running sequence is preempted, so the oldest requests
    keep their KV and finish first.
    """

    def admission_order(self, waiting: list[Sequence]) -> Iterable[Sequence]:
        """The waiting queue as it stands: preempted sequences first, then arrivals in order."""
        return list(waiting)

    def preemption_victim(self, running: list[Sequence]) -> Sequence:
        """The newest running sequence (running sequences are kept in admission order)."""
        return running[-1]
