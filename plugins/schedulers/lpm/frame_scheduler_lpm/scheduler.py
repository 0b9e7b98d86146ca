"""LpmPolicy: SGLang's longest-prefix-match admission, for frame's continuous-batching mechanism."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from frame.interfaces.scheduler import PrefixLookup, SchedulerLimits, SchedulingPolicy
from frame.sequence import Sequence
from pydantic import BaseModel, ConfigDict, Field


class LpmOptions(BaseModel):
    """Options of the lpm scheduler (``sched_options`` / ``--sched-opt key=value``)."""

    model_config = ConfigDict(extra="forbid")

    max_waiting_for_lpm: int = Field(
        128, ge=0, description="rank by cached prefix only while at most this many requests wait; beyond it, "
        "admit in arrival order (ranking costs one prefix lookup per waiting request per step)")
    in_batch_prefix_tokens: int = Field(
        32, ge=0, description="defer a waiting request whose first this-many tokens, not cached yet, equal those "
        "of an earlier waiting one, so that it reuses that one's KV instead of computing it alongside; 0: off")


class LpmPolicy(SchedulingPolicy):
    """Admits the waiting requests whose prompts have the longest cached prefix first.

    The cached length comes from the active cache strategy through the engine (``prefix.cached_prefix_tokens``),
    so the policy works over any strategy; ties go to the earlier arrival. Requests that share an uncached prefix
    with an earlier waiting one are ranked last (see :class:`LpmOptions`), and with ``in_batch_prefix_tokens`` 0
    the engine's in-batch prefix wait is off too. Above ``max_waiting_for_lpm`` waiting requests the order is the
    queue's (preempted first, then arrival), as with fcfs. The preemption victim is the most recently admitted
    running request.
    """

    def __init__(self, limits: SchedulerLimits, options: LpmOptions | None = None) -> None:
        super().__init__(limits)
        self.options = options or LpmOptions()
        self.share_prefills_in_batch = self.options.in_batch_prefix_tokens > 0

    def admission_order(self, waiting: Seq[Sequence], prefix: PrefixLookup) -> Iterable[Sequence]:
        """Waiting requests by (deferred, longest cached prefix, arrival time)."""
        if len(waiting) > self.options.max_waiting_for_lpm:
            return waiting
        cached = {seq.seq_id: prefix.cached_prefix_tokens(seq) for seq in waiting}
        deferred = self.shares_uncached_prefix(waiting, cached)
        return sorted(waiting, key=lambda s: (s.seq_id in deferred, -cached[s.seq_id], s.arrival_time))

    def preemption_victim(self, running: Seq[Sequence]) -> Sequence:
        """The newest running request."""
        return running[-1]

    def shares_uncached_prefix(self, waiting: Seq[Sequence], cached: dict[str, int]) -> set[str]:
        """Ids of waiting requests whose leading ``in_batch_prefix_tokens`` tokens are not cached and equal
        those of an earlier arrival (under the same extra keys): computing them together would compute that
        prefix twice, while the later one can reuse it once the earlier one has written it."""
        length = self.options.in_batch_prefix_tokens
        if length == 0:
            return set()
        first_seen: set[tuple[tuple[str, ...], tuple[int, ...]]] = set()
        deferred: set[str] = set()
        for seq in sorted(waiting, key=lambda s: s.arrival_time):
            if cached[seq.seq_id] >= length or seq.num_tokens <= length:
                continue
            key = (seq.extra_keys, tuple(seq.token_ids[:length]))
            if key in first_seen:
                deferred.add(seq.seq_id)
            else:
                first_seen.add(key)
        return deferred
