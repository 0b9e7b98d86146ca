"""Rejection sampling on its own: the tokens verification emits are distributed exactly as the target's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from frame.engine.wire.plan import NewRequest
from frame.engine.worker.batch import PersistentBatch
from frame.engine.worker.speculation import verify
from frame.sampling_params import SamplingParams

VOCAB = 5
#: Target logits at three positions: after the prompt, after draft 1, after draft 2.
TARGET = torch.tensor([[1.0, 0.3, -0.5, 0.0, -1.0], [0.0, 0.8, 0.2, -0.3, 0.1], [0.5, -0.2, 0.0, 0.9, -1.5]])
DRAFTS = [1, 3]


def one_request(params: SamplingParams) -> PersistentBatch:
    batch = PersistentBatch(2, 64, 4)
    batch.add(NewRequest(req_id="r", prompt_token_ids=[0, 2, 4], params=params, block_ids=[0], num_computed_tokens=0,
                         num_new_tokens=3), None)
    return batch


def empirical(batch: PersistentBatch, q: torch.Tensor | None, trials: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Counts of the first emitted token, of the second when the first draft was kept, and how often it was.

    Without ``q`` the drafts are always ``DRAFTS`` (a deterministic proposer); with it, each trial draws its drafts
    from ``q``, as a sampling proposer would. The target's distribution at a position does not depend on the
    tokens before it here, so a kept first draft is followed by a token distributed as row 1."""
    generator = torch.Generator().manual_seed(0)
    first, second, accepted = np.zeros(VOCAB), np.zeros(VOCAB), 0
    for _ in range(trials):
        drafts = DRAFTS if q is None else torch.multinomial(q, 1, generator=generator).flatten().tolist()
        [out] = verify(TARGET, batch, [0], [drafts], [q], generator)
        first[out.token_ids[0]] += 1
        if out.token_ids[0] == drafts[0] and len(out.token_ids) > 1:
            accepted += 1
            second[out.token_ids[1]] += 1
    return first, second, accepted


def assert_matches(counts: np.ndarray, probs: torch.Tensor) -> None:
    total = counts.sum()
    expected = probs.numpy() * total
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, f"chi-square {chi2:.1f} (4 degrees of freedom; p < 0.0005 at 20.5): {counts} vs {expected}"


@pytest.mark.parametrize("draft_kind", ["deterministic", "sampled"])
def test_emitted_tokens_follow_the_target_distribution(draft_kind: str) -> None:
    batch = one_request(SamplingParams(temperature=1.0, max_tokens=8))
    q = None
    if draft_kind == "sampled":  # a draft distribution unlike the target's, with mass on the drafted tokens
        q = torch.softmax(torch.tensor([[0.0, 2.0, 0.0, 0.5, 0.0], [0.3, 0.0, -1.0, 1.5, 0.0]]), dim=-1)
    first, second, accepted = empirical(batch, q, 4000)
    target = torch.softmax(TARGET, dim=-1)
    assert_matches(first, target[0])
    assert accepted > 600
    assert_matches(second, target[1])


def test_temperature_and_top_k_shape_the_target_before_verification() -> None:
    batch = one_request(SamplingParams(temperature=0.7, top_k=2, max_tokens=8))
    trials = 1500
    first, _, _ = empirical(batch, None, trials)
    top2 = torch.topk(TARGET[0], 2).indices.tolist()  # tokens 0 and 3
    assert first.sum() == first[top2].sum(), "a token outside the top 2 was emitted"
    shaped = torch.softmax(TARGET[0, top2] / 0.7, dim=-1)[0].item()
    sigma = (trials * shaped * (1 - shaped)) ** 0.5
    assert abs(first[top2[0]] - trials * shaped) < 4 * sigma, (first, trials * shaped)


def test_greedy_keeps_drafts_while_they_are_the_argmax() -> None:
    batch = one_request(SamplingParams(temperature=0.0, max_tokens=8, logprobs=1))
    generator = torch.Generator().manual_seed(0)
    [all_kept] = verify(TARGET, batch, [0], [[0, 1]], [None], generator)  # argmaxes are 0, 1, 3
    assert all_kept.token_ids == [0, 1, 3] and len(all_kept.logprobs) == 3
    [first_wrong] = verify(TARGET, batch, [0], [[2, 1]], [None], generator)
    assert first_wrong.token_ids == [0]
    assert all_kept.logprobs[0].logprob == pytest.approx(float(torch.log_softmax(TARGET[0], -1)[0]))


def test_logit_bias_shapes_the_target_before_verification() -> None:
    batch = one_request(SamplingParams(temperature=0.0, max_tokens=8, logit_bias={4: 100.0}))
    [kept] = verify(TARGET, batch, [0], [[4, 4]], [None], torch.Generator().manual_seed(0))
    assert kept.token_ids == [4, 4, 4]  # the unbiased argmaxes are 0, 1, 3
