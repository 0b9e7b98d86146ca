"""Prompt logprobs equal transformers' log-softmax of the same positions (float32, same weights), whole prefills
and prefills split into chunks alike; a request that asks for them takes no prefix-cache hit but publishes its
blocks; with ``n`` completions the prompt is scored once."""

from __future__ import annotations

import pytest
import torch
from frame import LLM, SamplingParams

#: Largest allowed difference between frame's and transformers' prompt logprobs (float32, same weights).
PROMPT_LOGPROB_ATOL = 0.05
TOP = 3


def _reference(model, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("budget", [4096, 13])  # the whole prompt in one step; chunks of 13 tokens, batched
def test_prompt_logprobs_match_transformers(budget: int, hf_reference, chat_prompts) -> None:
    llm = LLM(dtype="float32", max_model_len=1024, max_num_batched_tokens=budget, max_num_seqs=4,
              quantization="none")
    prompts = chat_prompts[:4]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=TOP)
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    worst = 0.0
    for prompt, result in zip(prompts, results, strict=True):
        exact = _reference(hf_reference, prompt)
        got = result.prompt_logprobs
        assert got is not None and len(got) == len(prompt) and got[0] is None
        for i in range(1, len(prompt)):
            position, own = got[i], exact[i - 1, prompt[i]].item()
            assert position is not None and prompt[i] in position
            worst = max(worst, abs(position[prompt[i]].logprob - own))
            rank = position[prompt[i]].rank  # its rank in the whole distribution, near-ties either way
            assert rank is not None
            assert (exact[i - 1] > own + 1e-3).sum() + 1 <= rank <= (exact[i - 1] > own - 1e-3).sum() + 1
            values, ids = torch.topk(exact[i - 1], TOP)
            ranked = {tid: lp for tid, lp in position.items() if lp.rank is not None and lp.rank <= TOP}
            assert sorted(lp.rank for lp in ranked.values()) == list(range(1, TOP + 1))
            for token_id, ref in zip(ids.tolist(), values.tolist(), strict=True):
                if token_id in ranked:
                    worst = max(worst, abs(ranked[token_id].logprob - ref))
                else:  # a near-tie swapped into the top from just below it
                    assert ref < min(lp.logprob for lp in ranked.values()) + PROMPT_LOGPROB_ATOL
    assert worst <= PROMPT_LOGPROB_ATOL


def test_prompt_logprobs_recompute_a_cached_prefix_and_publish_it(chat_prompts) -> None:
    llm = LLM(dtype="float32", max_model_len=1024, cache="hashchain")
    prompt = {"prompt_token_ids": chat_prompts[0]}
    asking = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    first = llm.generate(prompt, asking)[0]
    again = llm.generate(prompt, asking)[0]
    assert again.num_cached_tokens == 0  # recomputed, so every position has logits
    assert again.prompt_logprobs == first.prompt_logprobs
    plain = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1))[0]
    assert plain.num_cached_tokens > 0  # the asking requests published their blocks
    assert plain.prompt_logprobs is None


def test_n_completions_score_the_prompt_once(chat_prompts) -> None:
    llm = LLM(dtype="float32", max_model_len=1024)
    prompt = chat_prompts[1]
    result = llm.generate({"prompt_token_ids": prompt},
                          SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=2, prompt_logprobs=1))[0]
    assert len(result.outputs) == 3
    assert result.prompt_logprobs is not None and len(result.prompt_logprobs) == len(prompt)
    single = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1, prompt_logprobs=1))[0]
    assert single.prompt_logprobs is not None
    for mine, alone in zip(result.prompt_logprobs[1:], single.prompt_logprobs[1:], strict=True):
        assert mine is not None and alone is not None and mine.keys() == alone.keys()
        assert all(mine[t].logprob == pytest.approx(alone[t].logprob, abs=1e-4) for t in mine)


def test_logit_bias_forces_and_bans_tokens(chat_prompts) -> None:
    llm = LLM(dtype="float32", max_model_len=1024)
    prompt = {"prompt_token_ids": chat_prompts[0]}
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
    plain = llm.generate(prompt, greedy)[0].outputs[0]
    first = plain.token_ids[0]
    second = next(t for t, lp in plain.logprobs[0].items() if lp.rank == 2)
    banned = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=1, logit_bias={first: -100.0}))[0]
    assert banned.outputs[0].token_ids == [second]
    forced = llm.generate(prompt, SamplingParams(temperature=0.7, seed=3, max_tokens=4, ignore_eos=True,
                                                 logit_bias={42: 100.0}))[0]
    assert forced.outputs[0].token_ids == [42] * 4
