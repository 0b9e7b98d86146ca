"""Speculative decoding end to end: greedy tokens with the ngram and draft proposers equal those without.

Verification keeps a draft only where it equals the target's own greedy choice, so greedy output cannot change;
stop tokens, ``max_tokens`` and preemption must cut or redo a multi-token step exactly where one-token steps would.
The draft proposer drafts with the bundled model itself (allowed by the issue): its drafts are nearly always kept.
"""

from __future__ import annotations

import pytest
from frame import LLM, SamplingParams
from frame.errors import InvalidSamplingError

COPY = ("Rewrite this sentence with 'cat' instead of 'dog': The dog sat on the mat, and the dog was happy because "
        "the dog liked the mat. Rewritten: The cat sat on the mat, and the")


@pytest.fixture(scope="module")
def prompts(chat_prompts, smol_source) -> list[list[int]]:
    copy = smol_source.tokenizer(COPY)["input_ids"]
    return [copy, *chat_prompts[:3]]


@pytest.fixture(scope="module")
def reference(prompts) -> list[list[int]]:
    llm = LLM(dtype="float32", quantization="none", max_model_len=512)
    return generate(llm, prompts)


def generate(llm: LLM, prompts: list[list[int]], **params) -> list[list[int]]:
    params = {"temperature": 0, "max_tokens": 40, "ignore_eos": True, **params}
    return [r.outputs[0].token_ids for r in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                         SamplingParams(**params))]


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_greedy_tokens_equal_those_without_speculation(proposer: str, prompts, reference) -> None:
    llm = LLM(dtype="float32", quantization="none", max_model_len=512, speculative_proposer=proposer,
              num_speculative_tokens=3, speculative_options={"num_blocks": 256} if proposer == "draft" else {})
    assert generate(llm, prompts) == reference
    stats = llm.stats()
    assert stats.spec_draft_tokens > 0 and stats.spec_accepted_tokens > 0
    assert stats.steps < 4 * 40  # fewer steps than one token per request and step would take
    if proposer == "draft":  # the model drafting for itself: the target keeps nearly every draft
        assert stats.spec_acceptance_rate > 0.8 and stats.spec_mean_accepted_length > 3.0
    # Stop tokens and max_tokens inside a verified run cut it where one-token steps would stop.
    stop = reference[0][5]
    cut = generate(llm, prompts[:1], stop_token_ids=[stop], max_tokens=40)
    assert cut == [reference[0][: reference[0].index(stop) + 1]]
    assert generate(llm, prompts, max_tokens=7) == [tokens[:7] for tokens in reference]


def test_a_request_may_ask_for_fewer_drafts_but_not_more(prompts, reference) -> None:
    llm = LLM(dtype="float32", quantization="none", max_model_len=512, speculative_proposer="ngram",
              num_speculative_tokens=2)
    assert generate(llm, prompts[:1], num_speculative_tokens=0) == reference[:1]
    assert llm.stats().spec_draft_tokens == 0
    with pytest.raises(InvalidSamplingError, match="num_speculative_tokens 5 exceeds this engine's 2"):
        generate(llm, prompts[:1], num_speculative_tokens=5)
    plain = LLM(dtype="float32", quantization="none", max_model_len=256, num_kv_blocks=32)
    with pytest.raises(InvalidSamplingError, match="start it with --speculative-proposer"):
        generate(plain, prompts[:1], num_speculative_tokens=1)


def test_preemption_and_sampling_with_drafts(prompts, reference) -> None:
    # A pool of 12 blocks cannot hold four requests of up to 100 tokens: some are preempted, drafts and all.
    llm = LLM(dtype="float32", quantization="none", max_model_len=128, num_kv_blocks=12, speculative_proposer="ngram",
              num_speculative_tokens=3)
    assert generate(llm, prompts) == reference
    assert llm.stats().preemptions > 0
    seeded = [generate(llm, prompts[:2], temperature=0.8, seed=5, max_tokens=16) for _ in range(2)]
    assert seeded[0] == seeded[1] and all(len(t) == 16 for t in seeded[0])


def test_no_drafts_while_the_batch_is_larger_than_the_limit(prompts, reference) -> None:
    # Four requests decode together above a limit of 2: nobody drafts until only two are left. With a limit of 4
    # the same requests draft from the first decode step.
    limited = LLM(dtype="float32", quantization="none", max_model_len=512, speculative_proposer="ngram",
                  num_speculative_tokens=3, speculative_disable_by_batch_size=2)
    assert generate(limited, prompts, max_tokens=12) == [t[:12] for t in reference]
    assert limited.stats().spec_draft_tokens == 0  # all four run to the end together
    assert generate(limited, prompts[:1], max_tokens=40) == reference[:1]
    assert limited.stats().spec_draft_tokens > 0
    free = LLM(dtype="float32", quantization="none", max_model_len=512, speculative_proposer="ngram",
               num_speculative_tokens=3, speculative_disable_by_batch_size=4)
    assert generate(free, prompts, max_tokens=12) == [t[:12] for t in reference]
    assert free.stats().spec_draft_tokens > 0
