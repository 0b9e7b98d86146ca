"""Greedy output equals transformers' token for token; top-5 logprobs agree within a stated tolerance."""

from __future__ import annotations

import pytest
import torch
from frame import LLM, SamplingParams

#: Largest allowed difference between frame's and transformers' top-5 logprobs (float32, same weights).
LOGPROB_ATOL = 2e-3
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", cache="hashchain", sched="fcfs", max_model_len=1024)


def _hf_greedy(model, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [torch.log_softmax(s[0].float(), dim=-1) for s in out.scores]


def test_greedy_tokens_and_logprobs_match_transformers(llm: LLM, hf_reference, chat_prompts) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=5)
    results = llm.generate([{"prompt_token_ids": p} for p in chat_prompts], params)
    assert len(chat_prompts) >= 8
    worst = 0.0
    for prompt, result in zip(chat_prompts, results, strict=True):
        expected, hf_logprobs = _hf_greedy(hf_reference, prompt)
        got = result.outputs[0].token_ids
        n = len(expected)  # transformers stops early at EOS even with ignore_eos on our side
        assert got[:n] == expected, f"prompt {prompt[:8]}... diverged"
        for position, (mine, theirs) in enumerate(zip(result.outputs[0].logprobs[:n], hf_logprobs, strict=True)):
            values, ids = torch.topk(theirs, 5)
            for token_id, ref in zip(ids.tolist(), values.tolist(), strict=True):
                assert token_id in mine, f"position {position}: token {token_id} missing from frame's top-5"
                worst = max(worst, abs(mine[token_id].logprob - ref))
    assert worst <= LOGPROB_ATOL


def test_text_is_the_detokenised_tokens(llm: LLM, chat_prompts) -> None:
    result = llm.generate({"prompt_token_ids": chat_prompts[0]}, SamplingParams(temperature=0, max_tokens=16))[0]
    out = result.outputs[0]
    tokenizer = llm.get_tokenizer()
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
    assert "Paris" in out.text
