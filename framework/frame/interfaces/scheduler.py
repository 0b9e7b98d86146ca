"""Scheduler: decides, each step, which sequences run and how many of their tokens are computed.

Schedulers are bookkeeping over token and block ids (no tensors). The engine core calls :meth:`Scheduler.schedule`
once per step, hands the result to the model runner, and reports the sampled tokens back through
:meth:`Scheduler.update`. Most schedulers subclass :class:`frame.scheduling.PolicyScheduler`, which implements
vLLM-style continuous batching (token budget, chunked prefill, preemption by recompute) and leaves the policy
(admission order, preemption victim) to the plugin.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel

from frame.interfaces.cache import BlockCopy, KVCacheStrategy
from frame.sequence import Sequence


class SchedulerLimits(BaseModel):
    """The engine limits every scheduler honours (taken from the engine config)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence in a step: compute ``num_new_tokens`` tokens starting at its ``num_computed_tokens``."""

    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the sequence's known tokens, so a token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    """What one step computes: the scheduled sequences (decodes and prefill chunks mixed, in batch order),
    the block copies the runner performs first, and the sequences preempted to make room this step."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    copies: list[BlockCopy] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class StepResult:
    """What the runner produced for one sampled sequence: the token and, if asked, its logprobs."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


class Scheduler(ABC):
    """Owns the waiting and running queues and drives the KV-cache strategy.

    Lifecycle: :meth:`add` a sequence; each step :meth:`schedule` then :meth:`update`; :meth:`abort` at any
    time between steps. A finished, aborted or preempted sequence's blocks are freed by the scheduler through
    the cache strategy; a preempted sequence goes back to the waiting queue and is recomputed later.
    """

    def __init__(self, limits: SchedulerLimits, cache: KVCacheStrategy) -> None:
        self.limits = limits
        self.cache = cache

    @abstractmethod
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (status WAITING)."""

    @abstractmethod
    def abort(self, seq_id: str) -> Sequence | None:
        """Remove a sequence wherever it is, free its blocks, mark it FINISHED_ABORTED; None if unknown."""

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Choose this step's batch under the limits; allocates blocks through the cache strategy.

        Must make progress whenever a sequence is unfinished and the pool could ever hold it; it may preempt
        running sequences (free their blocks, status PREEMPTED, back to waiting) to do so.
        """

    @abstractmethod
    def update(self, output: SchedulerOutput, results: Mapping[str, StepResult]) -> list[Sequence]:
        """Account for a finished step and return the sequences that finished in it.

        Advances each scheduled sequence's ``num_computed_tokens``, commits its KV to the cache, appends the
        sampled token of each sequence in ``results``, applies stop rules (EOS, stop token ids, max tokens,
        model length), frees the blocks of finished sequences and removes them from the queues.
        """

    @property
    @abstractmethod
    def num_waiting(self) -> int:
        """Sequences queued and not running (new or preempted)."""

    @property
    @abstractmethod
    def num_running(self) -> int:
        """Sequences holding KV blocks."""

    def has_unfinished(self) -> bool:
        return self.num_waiting + self.num_running > 0
