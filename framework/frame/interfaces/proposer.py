"""Proposer: drafts the next few tokens of running requests, for the target model to verify in one forward pass.

Speculative decoding: after each step samples, the proposer guesses up to ``num_speculative_tokens`` tokens that
may follow each request; the engine schedules them as lookahead slots of the next step, the runner computes the
target model's distributions at every one of them in one forward pass, and rejection sampling keeps the longest
run of drafts the target agrees with, plus one token of its own. The output distribution is the target model's
exactly, whatever the proposer proposes; a good proposer only makes it faster.

A proposer lives in the model worker (it may hold tensors: a draft model has its own weights and KV). It sees
each request's token ids (the runner's copy, numpy int32) and nothing else of the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class ProposalRequest:
    """One request to propose for: all its tokens so far (the one just sampled last), read-only, and how many
    drafts it may take (at most the configured count; fewer near ``max_tokens`` or the context's end)."""

    req_id: str
    token_ids: np.ndarray
    max_tokens: int


@dataclass(frozen=True)
class Proposal:
    """Drafts for one request (possibly none). ``probs`` is the draft distribution each draft was sampled from,
    float32 ``[len(token_ids), vocab]``; None when the drafts were chosen deterministically (n-gram lookup, a
    draft model's argmax), which the verifier then treats as a distribution with all its mass on the draft."""

    token_ids: list[int]
    probs: torch.Tensor | None = None


@dataclass(frozen=True)
class ProposerContext:
    """What the engine tells a proposer when it is created.

    ``load_draft_model(model)`` builds a :class:`~frame.engine.worker.drafting.DraftModel`
    (a model with its own paged KV) from a checkpoint path on this worker's platform and dtype; ``world_size`` is
    the tensor-parallel size.
    """

    vocab_size: int
    max_model_len: int
    max_num_seqs: int
    world_size: int
    load_draft_model: Any


class Proposer(ABC):
    """Proposes drafts once per step, for every request that sampled in it. Called from the worker's thread."""

    def __init__(self, num_speculative_tokens: int) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be at least 1, got {num_speculative_tokens}")
        self.num_speculative_tokens = num_speculative_tokens

    @abstractmethod
    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        """One :class:`Proposal` per request, in order, each with at most ``request.max_tokens`` drafts."""

    def forget(self, req_id: str) -> None:  # noqa: B027 - optional hook, empty by design
        """``req_id`` ended or was preempted: drop anything kept for it (a draft model's KV)."""
