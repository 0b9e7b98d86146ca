"""SjfScheduler: shortest job first over frame's continuous batching (an author's fill-in of the skeleton)."""

from __future__ import annotations

from frame.scheduling import PolicyScheduler
from frame.sequence import Sequence


class SjfScheduler(PolicyScheduler):
    """Admits the waiting sequence with the fewest prompt tokens first; preempts the one holding the most tokens."""

    def admission_order(self, waiting: list[Sequence]) -> list[Sequence]:
        return sorted(waiting, key=lambda seq: (seq.num_prompt_tokens, seq.arrival_time))

    def preemption_victim(self, running: list[Sequence]) -> Sequence:
        return max(running, key=lambda seq: (seq.num_tokens, seq.arrival_time))
