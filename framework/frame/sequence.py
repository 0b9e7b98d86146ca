"""Sequence: the engine core's state for one generated completion.

Schedulers and KV-cache strategies read and advance these; they are the only mutable per-request state in the
core. A request with ``n > 1`` becomes ``n`` sequences that share the prompt (and, through the prefix cache,
its KV blocks).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from frame.sampling_params import SamplingParams

if TYPE_CHECKING:
    from frame.engine.wire.requests import TokenLogprobs


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life; the ``FINISHED_*`` members are terminal."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")


@dataclass(eq=False)
class Sequence:
    """One sequence of token ids and its progress through the engine.

    Invariants: ``0 <= num_computed_tokens <= num_tokens``; tokens ``[0, num_computed_tokens)`` have their KV in
    the blocks the KV-cache strategy holds for ``seq_id``. ``num_cached_tokens`` counts the prompt tokens that
    were reused from the prefix cache at the sequence's first admission (what vLLM reports under that name).
    """

    seq_id: str
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = 0.0
    priority: int = 0
    cache_salt: str | None = None
    eos_token_ids: frozenset[int] = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    stop_reason: int | str | None = None
    #: Draft tokens a proposer offered after the last step, to be verified in the next (speculative decoding).
    spec_token_ids: list[int] = field(default_factory=list)
    #: Prompt logprobs the runner reported (``params.prompt_logprobs``), held until they go out with a first token.
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    _all_token_ids: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"sequence {self.seq_id} has an empty prompt")
        self._all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        """Prompt and output token ids, in order (do not mutate; use :meth:`append_token`)."""
        return self._all_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV is not yet in the cache (the whole remaining prompt, or the last sampled token)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """True while prompt tokens remain to be computed."""
        return self.num_computed_tokens < self.num_prompt_tokens

    @property
    def extra_keys(self) -> tuple[str, ...]:
        """Keys beyond the token ids that decide whether KV may be shared (the tenant's cache salt)."""
        return (self.cache_salt,) if self.cache_salt is not None else ()

    @property
    def finished(self) -> bool:
        return self.status.finished

    def append_token(self, token_id: int) -> None:
        """Record a sampled token; its KV is computed on the next step."""
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)

    def reset_for_recompute(self) -> None:
        """Forget all KV progress after a preemption; the tokens themselves are kept and recomputed."""
        self.num_computed_tokens = 0
        self.spec_token_ids = []
        self.num_preemptions += 1
        self.status = SequenceStatus.PREEMPTED

    def finish(self, status: SequenceStatus, reason: int | str | None = None) -> None:
        if not status.finished:
            raise ValueError(f"{status} is not a finished status")
        self.status = status
        self.stop_reason = reason
