"""FcfsPolicy: vLLM's default scheduling policy, for frame's continuous-batching mechanism."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from frame.interfaces.scheduler import PrefixLookup, SchedulingPolicy
from frame.sequence import Sequence


class FcfsPolicy(SchedulingPolicy):
    """First come, first served.

    Admission follows the waiting queue: preempted requests at its front (the most recently preempted first,
    as in vLLM), then new ones in arrival order; the engine stops admitting at the first one the pool cannot
    hold. When the pool runs dry, the most recently admitted running request is preempted, so the oldest
    requests keep their KV and finish first.
    """

    def admission_order(self, waiting: Seq[Sequence], prefix: PrefixLookup) -> Iterable[Sequence]:
        """The waiting queue as it stands: preempted requests first, then arrivals in order."""
        return waiting

    def preemption_victim(self, running: Seq[Sequence]) -> Sequence:
        """The newest running request (running requests are kept in admission order)."""
        return running[-1]
