"""How many tokens each request computes in a step: the step being planned and its token budget, prefills that
wait a step to reuse a prefix computed in it, and the policy's cap on long prefills.

Helpers of :class:`~frame.engine.core.scheduler.Scheduler`; bookkeeping over sequences only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from frame.interfaces.cache import BlockCopy, KVCacheStrategy
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy, StepLoad
from frame.sequence import Sequence


def common_prefix_length(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, up to ``limit`` (binary search over C-speed slice compares)."""
    low, high = 0, min(limit, len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # a[:low] == b[:low], and the answer lies in [low, high]
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


@dataclass
class Step:
    """A step being planned: the requests it computes, in batch order, and what happened to make room.
    ``long_prefills``: the running requests whose remaining prompt is a long prefill (see
    :meth:`~frame.interfaces.scheduler.SchedulingPolicy.prefill_limit`), those admitted this step included."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    spec: dict[str, list[int]] = field(default_factory=dict)  # drafts verified this step, by request
    copies: list[BlockCopy] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    budget: int = 0
    long_prefills: set[str] = field(default_factory=set)

    def drop(self, seq: Sequence) -> None:
        """Take ``seq`` out of the step (it was preempted) and give its tokens back to the budget."""
        self.long_prefills.discard(seq.seq_id)
        for item in self.scheduled:
            if item[0] is seq:
                self.scheduled.remove(item)
                self.budget += item[1]
                return


def start_step(limits: SchedulerLimits, running: list[Sequence]) -> Step:
    """A new step with the whole budget, knowing which running requests are in a long prefill."""
    threshold = limits.long_prefill_token_threshold
    long = {s.seq_id for s in running if threshold and s.is_prefilling and s.num_uncomputed_tokens > threshold}
    return Step(budget=limits.max_num_batched_tokens, long_prefills=long)


def prefill_chunk(policy: SchedulingPolicy, seq: Sequence, remaining: int, step: Step, num_requests: int,
                  admitting: bool) -> int:
    """The prompt tokens ``seq`` computes this step: the policy's limit within the budget (0: none this step).
    ``num_requests``: requests the scheduler holds, ``seq`` included."""
    load = StepLoad(num_others=num_requests - 1, num_long_prefills=len(step.long_prefills - {seq.seq_id}),
                    admitting=admitting)
    chunk = max(0, min(remaining, step.budget, policy.prefill_limit(seq, remaining, load)))
    threshold = policy.limits.long_prefill_token_threshold
    if chunk and threshold and remaining > threshold:
        step.long_prefills.add(seq.seq_id)
    return chunk


def waits_for_shared_prefill(seq: Sequence, num_cached: int, step: Step, cache: KVCacheStrategy,
                             policy: SchedulingPolicy) -> bool:
    """True when ``seq`` should sit this step out because a prefill in ``step`` writes at least half of its
    remaining tokens, whole blocks of them, which the cache can hand to ``seq`` once written. Without this, 64
    requests behind one 1,000-token system prompt compute that prompt once per request that fits the first
    step's token budget. A prefill counts with its whole prompt, not this step's chunk: one held to a long
    prefill's share of the step writes the rest in the next steps, and ``seq`` waits for it."""
    if not (cache.reuses_prefixes and policy.share_prefills_in_batch):
        return False
    block = cache.block_size
    remaining = seq.num_tokens - num_cached
    for other, _ in step.scheduled:
        if not other.is_prefilling or other.extra_keys != seq.extra_keys:
            continue
        written = min(other.num_prompt_tokens, seq.num_tokens - 1)
        gain = common_prefix_length(seq.token_ids, other.token_ids, written) // block * block - num_cached
        if gain >= block and 2 * gain >= remaining:
            return True
    return False
