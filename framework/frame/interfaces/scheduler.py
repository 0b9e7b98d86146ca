"""SchedulingPolicy: what a scheduler plugin decides; the engine owns the mechanism around it.

Each step the engine's scheduler (``frame.engine.core.scheduler``) runs vLLM-style continuous batching: running
requests first (decodes and unfinished prefill chunks), then waiting ones, under a token budget and a running
limit, chunking long prompts and preempting (free the blocks, recompute later) when the KV pool runs dry. It
advances progress, applies stop rules and frees blocks after the step. A scheduler plugin supplies only the
policy: the order in which waiting requests are admitted and which running request is preempted.

Policies read :class:`frame.sequence.Sequence` objects and must not change them. The fields a policy may read:
``seq_id``, ``prompt_token_ids``, ``token_ids``, ``num_tokens``, ``num_prompt_tokens``, ``num_output_tokens``,
``num_computed_tokens``, ``num_uncomputed_tokens``, ``is_prefilling``, ``params`` (its
:class:`~frame.sampling_params.SamplingParams`: ``max_tokens``, ``n`` ...), ``arrival_time``, ``priority``,
``cache_salt``, ``extra_keys``, ``num_preemptions`` and ``status``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from frame.sequence import Sequence


class SchedulerLimits(BaseModel):
    """The engine limits the scheduler honours (taken from the engine config)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    #: A prefill chunk over this many tokens is a long prefill (0: none is); see SchedulingPolicy.prefill_limit.
    long_prefill_token_threshold: int = 0
    #: Most long prefills in progress at once (None: no limit); a long prompt past it waits, shorter ones pass it.
    max_long_partial_prefills: int | None = None
    #: Steps a batch of decodes runs in one engine step while nothing else waits (1: one; see Scheduler).
    num_continuous_decode_steps: int = 1


@dataclass(frozen=True)
class StepLoad:
    """What competes with one prefilling request in the step being planned (for
    :meth:`SchedulingPolicy.prefill_limit`).

    ``num_others``: requests other than it, running or waiting (0: it is alone). ``num_long_prefills``: running
    requests other than it whose remaining prompt is longer than ``long_prefill_token_threshold``. ``admitting``:
    it is waiting and would be admitted with this chunk (False: it is running).
    """

    num_others: int
    num_long_prefills: int
    admitting: bool


class PrefixLookup(Protocol):
    """What a policy may ask of the KV cache: how many leading tokens of a waiting request are cached now."""

    def cached_prefix_tokens(self, seq: Sequence) -> int:
        """Tokens of ``seq`` whose KV the active cache strategy could reuse if it were admitted now (no side
        effects; cheap enough to call for every waiting request every step)."""
        ...


class SchedulingPolicy(ABC):
    """The decisions of a scheduler plugin. One instance per engine; called from the engine core's thread.

    ``share_prefills_in_batch`` (an attribute a policy may set): when True, the default, a waiting request whose
    prompt is mostly an uncached prefix that another prefill computes in the same step sits that step out and
    reuses the prefix in the next
    (SGLang's in-batch prefix caching). The engine applies it only over a cache strategy that reuses prefixes.
    """

    def __init__(self, limits: SchedulerLimits) -> None:
        self.limits = limits
        self.share_prefills_in_batch = True

    @abstractmethod
    def admission_order(self, waiting: Seq[Sequence], prefix: PrefixLookup) -> Iterable[Sequence]:
        """The waiting requests in the order the engine tries to admit them this step.

        ``waiting`` is the queue as it stands: preempted requests at its front (most recently preempted first),
        then new ones in arrival order. Return some order of (a subset of) them; the engine admits along it while
        the budget, the running limit and the KV pool allow, and stops at the first request the pool cannot hold,
        so a request is never overtaken by a smaller one behind it. Must not change ``waiting`` or its requests.
        """

    @abstractmethod
    def preemption_victim(self, running: Seq[Sequence]) -> Sequence:
        """The running request that gives up its KV blocks when the pool runs dry.

        ``running`` (never empty) is in admission order. The victim may already be in this step's batch; the
        engine then takes it out and returns its tokens to the budget. Its progress is recomputed after it is
        admitted again.
        """

    def prefill_limit(self, seq: Sequence, remaining: int, load: StepLoad) -> int:
        """The most prompt tokens ``seq`` may compute this step; 0 leaves it out of the step (a waiting request is
        then passed over, and the requests behind it may be admitted).

        Called by the engine for each request with prompt tokens to compute (``remaining`` of them, after a prefix
        cache hit), running ones first, only with chunked prefill on; the engine then holds the chunk to the step's
        budget too. The default (vLLM's ``long_prefill_token_threshold`` and ``max_long_partial_prefills``): while
        other requests run or wait, a prefill of more than ``limits.long_prefill_token_threshold`` tokens takes at
        most that many per step, so a long prompt shares each step with short requests instead of starving them;
        alone, it takes the whole budget. A long prompt is not admitted while ``limits.max_long_partial_prefills``
        (when set) others are mid-way through theirs. Since API version 2.
        """
        threshold = self.limits.long_prefill_token_threshold
        if threshold == 0 or remaining <= threshold:
            return remaining
        most = self.limits.max_long_partial_prefills
        if load.admitting and most is not None and load.num_long_prefills >= most:
            return 0
        return threshold if load.num_others else remaining
