"""Engine behaviour on the real model: batch invariance, prefix caching, salts, preemption, n > 1."""

from __future__ import annotations

import pytest
from frame import LLM, SamplingParams
from frame.engine.core.chunking import common_prefix_length

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
BLOCK = 16


def _greedy_tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY, **kw) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in llm.generate([{"prompt_token_ids": p} for p in prompts], params, **kw)]


@pytest.fixture(scope="module")
def mixed_prompts(chat_prompts, smol_source) -> list[list[int]]:
    """16 prompts of mixed lengths (chat prompts, some with long filler)."""
    filler = smol_source.tokenizer("The quick brown fox jumps over the lazy dog. " * 12).input_ids
    prompts = []
    for i in range(16):
        base = chat_prompts[i % len(chat_prompts)]
        prompts.append(filler[: (i * 7) % 90] + base)
    return prompts


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", quantization="none", max_model_len=512, max_num_batched_tokens=256)


def test_batch_invariance(llm: LLM, mixed_prompts) -> None:
    together = _greedy_tokens(llm, mixed_prompts)
    for i in (0, 5, 11):
        llm.engine.cache.reset()
        assert _greedy_tokens(llm, [mixed_prompts[i]]) == [together[i]]


def test_prefix_cache_counts_salts_and_identical_outputs(chat_prompts, smol_source) -> None:
    """Each cache reuses exactly what its design allows on a repeated batch; salts isolate; outputs never change."""
    system = smol_source.tokenizer("You are a careful assistant. Answer briefly and precisely. " * 6).input_ids
    prompts = [system + p for p in chat_prompts[:6]]
    batch = [{"prompt_token_ids": p} for p in prompts]
    expected_reuse = {
        "hashchain": [(len(p) - 1) // BLOCK * BLOCK for p in prompts],  # whole blocks only
        "radix": [len(p) - 1 for p in prompts],  # every token but the last, which must be computed
        "none": [0] * len(prompts),
    }
    shared = min(common_prefix_length(prompts[0], p, len(p)) for p in prompts)
    outputs = {}
    for cache, expected in expected_reuse.items():
        llm = LLM(dtype="float32", quantization="none", cache=cache, max_model_len=512, block_size=BLOCK)
        first = llm.generate(batch, GREEDY)
        second = llm.generate(batch, GREEDY)
        assert [r.num_cached_tokens for r in second] == expected, cache
        salted = llm.generate(batch, GREEDY, cache_salt="tenant-b")
        # Nothing cached without the salt is reused; within the salted batch, later prompts may wait for the
        # first one's system prompt (in-batch prefix sharing), so they reuse at most that.
        salted_reuse = [r.num_cached_tokens for r in salted]
        assert salted_reuse[0] == 0 and max(salted_reuse) <= shared, (cache, salted_reuse)
        outputs[cache] = [[r.outputs[0].token_ids for r in run] for run in (first, second, salted)]
        assert outputs[cache][0] == outputs[cache][1] == outputs[cache][2], cache
        assert llm.stats().blocks_in_use == 0
    assert outputs["hashchain"] == outputs["radix"] == outputs["none"]


def test_preemption_loses_nothing_and_frees_the_pool(mixed_prompts) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    roomy = _greedy_tokens(LLM(dtype="float32", quantization="none", max_model_len=256), mixed_prompts[:6], params)
    tight = LLM(dtype="float32", quantization="none", max_model_len=256, num_kv_blocks=18, block_size=BLOCK)
    assert _greedy_tokens(tight, mixed_prompts[:6], params) == roomy
    stats = tight.stats()
    assert stats.preemptions > 0
    assert stats.blocks_in_use == 0
    assert tight.engine.cache.num_free_blocks == tight.engine.num_blocks


def test_n_completions_and_seeded_sampling(llm: LLM, chat_prompts) -> None:
    params = SamplingParams(n=3, temperature=0.9, top_p=0.95, seed=7, max_tokens=12)
    a = llm.generate({"prompt_token_ids": chat_prompts[1]}, params)[0]
    b = llm.generate({"prompt_token_ids": chat_prompts[1]}, params)[0]
    assert [o.index for o in a.outputs] == [0, 1, 2]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1


def test_stop_strings_and_stop_tokens(llm: LLM, chat_prompts) -> None:
    full = llm.generate({"prompt_token_ids": chat_prompts[0]}, SamplingParams(temperature=0, max_tokens=20))[0]
    text = full.outputs[0].text
    word = text.split()[2]
    cut = llm.generate({"prompt_token_ids": chat_prompts[0]},
                       SamplingParams(temperature=0, max_tokens=20, stop=[word]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == word
    assert cut.text == text[: text.index(word)]
    stop_id = full.outputs[0].token_ids[3]
    by_id = llm.generate({"prompt_token_ids": chat_prompts[0]},
                         SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop_id]))[0].outputs[0]
    assert by_id.token_ids == full.outputs[0].token_ids[:4] and by_id.stop_reason == stop_id
    assert llm.stats().blocks_in_use == 0


def test_chat_api_applies_the_template(llm: LLM) -> None:
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=16))
    assert "Paris" in out[0].outputs[0].text
    assert out[0].outputs[0].finish_reason in ("stop", "length")
