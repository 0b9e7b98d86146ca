"""SjfScheduler: shortest job first, a scheduling policy (an author's fill-in of the skeleton)."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from frame.interfaces.scheduler import PrefixLookup, SchedulingPolicy
from frame.sequence import Sequence


class SjfScheduler(SchedulingPolicy):
    """Admits the waiting request with the fewest prompt tokens first; preempts the one holding the most tokens."""

    def admission_order(self, waiting: Seq[Sequence], prefix: PrefixLookup) -> Iterable[Sequence]:
        return sorted(waiting, key=lambda seq: (seq.num_prompt_tokens, seq.arrival_time))

    def preemption_victim(self, running: Seq[Sequence]) -> Sequence:
        return max(running, key=lambda seq: (seq.num_tokens, seq.arrival_time))
