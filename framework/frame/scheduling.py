"""PolicyScheduler: vLLM-style continuous batching with the policy left to a plugin.

Each step: running sequences first (decodes and unfinished prefill chunks), then waiting ones, under a token
budget and a running-sequence limit; a prompt longer than the remaining budget is prefilled in chunks; when the
pool runs dry, the policy's preemption victim loses its blocks and is recomputed later. A scheduler plugin
subclasses this and overrides :meth:`PolicyScheduler.admission_order` and
:meth:`PolicyScheduler.preemption_victim` (or :meth:`schedule` itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.scheduler import (
    ScheduledSequence,
    Scheduler,
    SchedulerLimits,
    SchedulerOutput,
    StepResult,
)
from frame.sequence import Sequence, SequenceStatus


def stop_status(seq: Sequence, max_model_len: int) -> tuple[SequenceStatus, int | None] | None:
    """The finished status ``seq`` reached with its last token, or None; the second item is the stop token."""
    params = seq.params
    last = seq.output_token_ids[-1]
    if seq.num_output_tokens >= params.min_tokens:
        if not params.ignore_eos and last in seq.eos_token_ids:
            return SequenceStatus.FINISHED_STOPPED, last
        if last in params.stop_token_ids:
            return SequenceStatus.FINISHED_STOPPED, last
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return SequenceStatus.FINISHED_LENGTH, None
    if seq.num_tokens >= max_model_len:
        return SequenceStatus.FINISHED_LENGTH, None
    return None


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


class PolicyScheduler(Scheduler):
    """Continuous batching with chunked prefill and preemption by recompute.

    Subclasses choose the policy:

    - :meth:`admission_order`: the order in which waiting sequences are tried (default: queue order, which is
      arrival order with preempted sequences in front);
    - :meth:`preemption_victim`: which running sequence gives up its blocks when the pool runs dry (default:
      the most recently admitted).

    Admission stops at the first sequence in that order that the pool cannot hold, so a policy's order is
    never jumped by a smaller request behind it. A waiting sequence whose prompt is mostly an uncached prefix
    that another prefill computes this very step waits one step and reuses it instead (SGLang's in-batch prefix
    caching; see :meth:`waits_for_shared_prefill`).
    """

    def __init__(self, limits: SchedulerLimits, cache: KVCacheStrategy) -> None:
        super().__init__(limits, cache)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # -- policy -------------------------------------------------------------------------------------------
    def admission_order(self, waiting: list[Sequence]) -> Iterable[Sequence]:
        """Waiting sequences in the order to try admitting them. Must not mutate ``waiting``."""
        return list(waiting)

    def preemption_victim(self, running: list[Sequence]) -> Sequence:
        """The running sequence to preempt when blocks run out (``running`` is never empty)."""
        return running[-1]

    def waits_for_shared_prefill(self, seq: Sequence, num_cached: int, out: SchedulerOutput) -> bool:
        """True when ``seq`` (``num_cached`` of its tokens already cached) should sit this step out because a
        prefill scheduled in ``out`` writes at least half of its remaining tokens, whole blocks of them, which the
        cache can hand to ``seq`` next step. Without this, 64 requests behind one 1,000-token system prompt
        compute that prompt once per request that fits the first step's token budget.

        Always False over a strategy that does not reuse prefixes. Policies may override it (lpm turns it off
        with ``in_batch_prefix_tokens=0``)."""
        if not self.cache.reuses_prefixes:
            return False
        block = self.cache.block_size
        remaining = seq.num_tokens - num_cached
        for item in out.scheduled:
            other = item.seq
            if not other.is_prefilling or other.extra_keys != seq.extra_keys:
                continue
            written = min(other.num_computed_tokens + item.num_new_tokens, seq.num_tokens - 1)
            gain = common_prefix_length(seq.token_ids, other.token_ids, written) // block * block - num_cached
            if gain >= block and 2 * gain >= remaining:
                return True
        return False

    # -- queues -------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def add(self, seq: Sequence) -> None:
        if seq.finished:
            raise ValueError(f"sequence {seq.seq_id} is already finished ({seq.status.value}); add a new one")
        if any(s.seq_id == seq.seq_id for s in (*self.running, *self.waiting)):
            raise ValueError(f"sequence {seq.seq_id} is already queued")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq_id: str) -> Sequence | None:
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.seq_id == seq_id:
                    queue.remove(seq)
                    self.cache.free(seq)
                    seq.finish(SequenceStatus.FINISHED_ABORTED)
                    return seq
        return None

    # -- one step -----------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.limits.max_num_batched_tokens
        scheduled_ids: set[str] = set()

        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self.limits.enable_chunked_prefill and num_new < seq.num_uncomputed_tokens:
                index += 1
                continue
            while self.cache.allocate(seq, num_new) is None:
                victim = self.preemption_victim(self.running)
                budget += self._preempt(victim, out, scheduled_ids)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSequence(seq, num_new))
                scheduled_ids.add(seq.seq_id)
                budget -= num_new
            # Preempting an earlier sequence shifts the list; re-find where this one stands.
            if seq in self.running:
                index = self.running.index(seq) + 1

        if not out.preempted:
            self._admit(out, budget)
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        admitted: set[str] = set()
        for seq in self.admission_order(self.waiting):
            if budget <= 0 or len(self.running) >= self.limits.max_num_seqs:
                break
            match = self.cache.match(seq)
            if self.waits_for_shared_prefill(seq, match.num_tokens, out):
                continue
            remaining = seq.num_tokens - match.num_tokens
            num_new = min(remaining, budget)
            if not self.limits.enable_chunked_prefill and num_new < remaining:
                continue
            allocation = self.cache.allocate(seq, num_new, match)
            if allocation is None:
                break
            seq.num_computed_tokens += allocation.num_cached_tokens
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = allocation.num_cached_tokens
            out.copies.extend(allocation.copies)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.add(seq.seq_id)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
        if admitted:
            self.waiting = [s for s in self.waiting if s.seq_id not in admitted]

    def _preempt(self, victim: Sequence, out: SchedulerOutput, scheduled_ids: set[str]) -> int:
        """Preempt ``victim``; returns the budget it gives back if it was already scheduled this step."""
        self.running.remove(victim)
        self.cache.free(victim)
        victim.reset_for_recompute()
        self.waiting.insert(0, victim)
        out.preempted.append(victim)
        self.num_preemptions += 1
        refund = 0
        if victim.seq_id in scheduled_ids:
            scheduled_ids.discard(victim.seq_id)
            refund = sum(s.num_new_tokens for s in out.scheduled if s.seq is victim)
            out.scheduled = [s for s in out.scheduled if s.seq is not victim]
        return refund

    def update(self, output: SchedulerOutput, results: Mapping[str, StepResult]) -> list[Sequence]:
        finished: list[Sequence] = []
        for item in output.scheduled:
            seq = item.seq
            if seq.finished:  # aborted between schedule() and update()
                continue
            samples = item.samples  # read before num_computed_tokens moves
            seq.num_computed_tokens += item.num_new_tokens
            self.cache.commit(seq)
            if not samples:  # a prefill chunk short of the prompt's end: nothing was sampled
                continue
            result = results.get(seq.seq_id)
            if result is None:
                raise ValueError(f"the step sampled sequence {seq.seq_id} but no result was reported for it")
            seq.append_token(result.token_id)
            stop = stop_status(seq, self.limits.max_model_len)
            if stop is not None:
                seq.finish(*stop)
                finished.append(seq)
        if finished:
            done = {s.seq_id for s in finished}
            self.running = [s for s in self.running if s.seq_id not in done]
            for seq in finished:
                self.cache.free(seq)
        return finished
