"""Continuous decode steps on the bundled model: the runner's side (each row's sampled token fed back, the graph's
inputs moved on in place) gives the tokens and logprobs of one step at a time, and stops where they stop."""

from __future__ import annotations

import pytest
import torch
from frame import LLM, SamplingParams
from frame_platform_cpu.platform import CpuPlatform

DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    torch.bfloat16 not in CpuPlatform().supported_dtypes, reason="the CPU has no bfloat16 path"))]
ARGS = dict(attn="cpu_paged", max_model_len=256, max_num_seqs=4, quantization="none")


def generate(llm: LLM, prompts: list[list[int]], **params) -> list:
    return [r.outputs[0] for r in llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(**params))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("graphs", [True, False], ids=["replayed", "eager"])
def test_continuous_steps_give_the_tokens_and_logprobs_of_single_steps(dtype: str, graphs: bool,
                                                                       chat_prompts) -> None:
    prompts = [p[: 20 + 9 * i] for i, p in enumerate(chat_prompts[:3])]
    params = dict(temperature=0, max_tokens=13, ignore_eos=True, logprobs=2)
    single = LLM(dtype=dtype, cuda_graphs=graphs, **ARGS)
    continuous = LLM(dtype=dtype, cuda_graphs=graphs, num_continuous_decode_steps=5, **ARGS)
    for batch in (prompts, prompts[:1]):  # three rows decoding together, then one alone
        expected, got = generate(single, batch, **params), generate(continuous, batch, **params)
        assert [o.token_ids for o in got] == [o.token_ids for o in expected]
        for a, b in zip(got, expected, strict=True):
            assert [list(top) for top in a.logprobs] == [list(top) for top in b.logprobs]  # the top ids, in order
            values = [[lp.logprob for top in o.logprobs for lp in top.values()] for o in (a, b)]
            assert values[0] == pytest.approx(values[1], abs=1e-5)
    assert continuous.engine.stats().steps < single.engine.stats().steps


def test_a_stop_token_inside_the_steps_ends_the_request_there(chat_prompts) -> None:
    prompt = chat_prompts[0][:30]
    llm = LLM(dtype="float32", num_continuous_decode_steps=8, **ARGS)
    free = generate(llm, [prompt], temperature=0, max_tokens=12, ignore_eos=True)[0].token_ids
    stop = free[6]
    cut = generate(llm, [prompt], temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop])[0]
    assert cut.token_ids == free[: free.index(stop) + 1] and cut.finish_reason == "stop"
    # Every block came back: the runner's lookahead slots past the stop are freed with the request.
    assert llm.engine.cache.num_free_blocks == llm.engine.cache.num_blocks


def test_the_device_buffer_path_of_advance_moves_the_same_inputs(chat_prompts) -> None:
    """``DecodeGraphs.advance`` moves a CUDA graph's buffers with torch ops where the host's go through numpy
    views; the cpu platform's buffers are taken through that path here (the views dropped)."""
    prompt = chat_prompts[1][:40]
    params = dict(temperature=0, max_tokens=20, ignore_eos=True)
    expected = generate(LLM(dtype="float32", **ARGS), [prompt], **params)[0].token_ids
    llm = LLM(dtype="float32", num_continuous_decode_steps=6, **ARGS)
    llm.engine.executor.worker.runner.graphs._host = None
    assert generate(llm, [prompt], **params)[0].token_ids == expected


def test_a_constrained_request_and_a_proposer_each_keep_one_step_at_a_time(chat_prompts) -> None:
    import re

    from frame.sampling_params import StructuredOutputs

    llm = LLM(dtype="float32", num_continuous_decode_steps=6, **ARGS)
    before = llm.engine.stats().steps
    out = generate(llm, [chat_prompts[2][:30]], temperature=0, max_tokens=9,
                   structured_outputs=StructuredOutputs(regex=r"[0-9]{8}"))[0]
    assert re.fullmatch(r"[0-9]{8}", out.text)  # the grammar's mask applied to every token
    assert llm.engine.stats().steps - before >= len(out.token_ids)  # a step per token: no run of six
    drafting = LLM(dtype="float32", num_continuous_decode_steps=6, speculative_proposer="ngram", **ARGS)
    assert drafting.engine.limits.num_continuous_decode_steps == 1
