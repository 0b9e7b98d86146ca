"""LpmScheduler: SGLang's longest-prefix-match admission over frame's continuous-batching mechanism."""

from __future__ import annotations

from collections.abc import Iterable

from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.scheduler import SchedulerLimits, SchedulerOutput
from frame.scheduling import PolicyScheduler
from frame.sequence import Sequence
from pydantic import BaseModel, ConfigDict, Field


class LpmOptions(BaseModel):
    """Options of the lpm scheduler (``sched_options`` / ``--sched-opt key=value``)."""

    model_config = ConfigDict(extra="forbid")

    max_waiting_for_lpm: int = Field(
        128, ge=0, description="rank by cached prefix only while at most this many sequences wait; beyond it, "
        "admit in arrival order (ranking costs one prefix lookup per waiting sequence per step)")
    in_batch_prefix_tokens: int = Field(
        32, ge=0, description="defer a waiting sequence whose first this-many tokens, not cached yet, equal those "
        "of an earlier waiting one, so that it reuses that one's KV instead of computing it alongside; 0: off")


class LpmScheduler(PolicyScheduler):
    """Admits the waiting sequences whose prompts have the longest cached prefix first.

    The cached length comes from the active cache strategy through the contract (``cache.match(seq)``), so the
    policy works over any strategy; ties go to the earlier arrival. Sequences that share an uncached prefix with
    an earlier waiting one are ranked last (see :class:`LpmOptions`). Above ``max_waiting_for_lpm`` waiting
    sequences the order is the queue's (preempted first, then arrival), as with fcfs. The preemption victim is
    the most recently admitted running sequence.
    """

    def __init__(self, limits: SchedulerLimits, cache: KVCacheStrategy, options: LpmOptions | None = None) -> None:
        super().__init__(limits, cache)
        self.options = options or LpmOptions()

    def admission_order(self, waiting: list[Sequence]) -> Iterable[Sequence]:
        """Waiting sequences by (deferred, longest cached prefix, arrival time)."""
        if len(waiting) > self.options.max_waiting_for_lpm:
            return list(waiting)
        cached = {seq.seq_id: self.cache.match(seq).num_tokens for seq in waiting}
        deferred = self.shares_uncached_prefix(waiting, cached)
        return sorted(waiting, key=lambda s: (s.seq_id in deferred, -cached[s.seq_id], s.arrival_time))

    def waits_for_shared_prefill(self, seq: Sequence, num_cached: int, out: SchedulerOutput) -> bool:
        """The core's in-batch prefix wait, unless ``in_batch_prefix_tokens`` is 0 (prefix sharing off)."""
        return self.options.in_batch_prefix_tokens > 0 and super().waits_for_shared_prefill(seq, num_cached, out)

    def shares_uncached_prefix(self, waiting: list[Sequence], cached: dict[str, int]) -> set[str]:
        """Ids of waiting sequences whose leading ``in_batch_prefix_tokens`` tokens are not cached and equal
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
