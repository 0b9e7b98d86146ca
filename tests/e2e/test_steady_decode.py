"""A decode step that only continues the last replayed one (the same rows in the same order, each a token further
on, no block, request or constraint changed) moves the recorded step's buffers on in place
(``ModelRunner._continues_replay``, ``DecodeGraphs.advance``) instead of gathering the step from the persistent
batch. It must give what the general path gives: the same buffers, tokens, logprobs and seeded samples, over block
boundaries, rows that finish and rows that join."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from frame import LLM, SamplingParams
from frame.engine.wire.requests import EngineRequest
from frame_platform_cpu.platform import CpuPlatform

DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    torch.bfloat16 not in CpuPlatform().supported_dtypes, reason="the CPU has no bfloat16 path"))]
ARGS = dict(attn="cpu_paged", max_model_len=256, max_num_seqs=4, quantization="none")


def engine_with(dtype: str, steady: bool, **args) -> tuple[LLM, list[int]]:
    """An LLM whose runner takes the steady path (or never does: the general path), and a counter of the steps
    that took it."""
    llm = LLM(dtype=dtype, **ARGS, **args)
    runner = llm.engine.executor.worker.runner
    taken = [0]
    decide = runner._continues_replay

    def counted(plan, rows) -> bool:
        steady_step = steady and decide(plan, rows)
        taken[0] += steady_step
        return steady_step

    runner._continues_replay = counted
    return llm, taken


def generate(llm: LLM, prompts: list[list[int]], params: list[dict]) -> list:
    return [r.outputs[0] for r in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                               [SamplingParams(**p) for p in params])]


@pytest.mark.parametrize("dtype", DTYPES)
def test_steady_steps_give_the_general_paths_tokens_and_logprobs(dtype: str, chat_prompts) -> None:
    # Three rows that finish at different steps (3, then 2, then 1 decoding), each over two block boundaries.
    prompts = [p[: 20 + 7 * i] for i, p in enumerate(chat_prompts[:3])]
    params = [dict(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2) for n in (40, 25, 33)]
    (steady, taken), (general, never) = engine_with(dtype, True), engine_with(dtype, False)
    got, expected = generate(steady, prompts, params), generate(general, prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    for a, b in zip(got, expected, strict=True):
        assert [list(top) for top in a.logprobs] == [list(top) for top in b.logprobs]
        values = [[lp.logprob for top in o.logprobs for lp in top.values()] for o in (a, b)]
        assert values[0] == pytest.approx(values[1], abs=1e-5)
    # Most decode steps continue the last one; a new block, a finished row or the first decode after a prefill
    # does not.
    assert never[0] == 0 and 20 < taken[0] < 40
    assert steady.engine.cache.num_free_blocks == steady.engine.cache.num_blocks


def test_a_steady_step_moves_the_buffers_to_what_the_general_gather_gives(chat_prompts) -> None:
    llm, taken = engine_with("float32", True)
    runner = llm.engine.executor.worker.runner
    graphs = runner.graphs
    advance, checked = graphs.advance, []

    def advance_and_compare(input_ids: np.ndarray):
        logits = advance(input_ids)
        rows = runner._replayed_rows
        n = len(rows)
        host = runner.gather(rows, np.ones(n, dtype=np.int64), np.ones(n, dtype=bool))
        ids, pos, lens, slots, tables = graphs._host
        assert ids[:n].tolist() == host.input_ids.tolist()
        assert pos[:n].tolist() == host.positions.tolist() and lens[:n].tolist() == host.seq_lens.tolist()
        assert slots[0][:n].tolist() == host.slots.tolist()
        for i, row in enumerate(rows.tolist()):  # each row's blocks (past them: never read)
            held = int(runner.batch.num_blocks[row])
            assert tables[0][i, :held].tolist() == host.block_tables[i, :held].tolist()
        checked.append(n)
        return logits

    graphs.advance = advance_and_compare
    prompts = [chat_prompts[3][:25], chat_prompts[4][:31]]
    generate(llm, prompts, [dict(temperature=0, max_tokens=n, ignore_eos=True) for n in (30, 20)])
    assert taken[0] == len(checked) > 0 and set(checked) == {1, 2}


def test_seeded_sampling_and_penalties_draw_the_same_tokens(chat_prompts) -> None:
    prompts = [chat_prompts[5][:24], chat_prompts[6][:28]]
    params = [dict(temperature=0.9, top_p=0.9, seed=11, max_tokens=30, ignore_eos=True),
              dict(temperature=0.7, top_k=20, seed=5, repetition_penalty=1.3, max_tokens=30, ignore_eos=True)]
    (steady, taken), (general, _) = engine_with("float32", True), engine_with("float32", False)
    assert [o.token_ids for o in generate(steady, prompts, params)] == \
        [o.token_ids for o in generate(general, prompts, params)]
    assert taken[0] > 0


def test_rows_that_join_and_leave_between_steps_leave_the_steady_path_and_come_back(chat_prompts) -> None:
    """Requests arrive while others decode: the rows change (the general path), then settle (steady again)."""

    def run(steady: bool) -> tuple[dict[str, list[int]], int]:
        llm, taken = engine_with("float32", steady)
        core, tokens = llm.engine, {}
        arrivals = {0: 0, 6: 1, 9: 2, 30: 3}  # step -> prompt
        step = 0
        while step < 200 and (core.has_unfinished() or arrivals):
            if step in arrivals:
                i = arrivals.pop(step)
                core.add_request(EngineRequest(
                    request_id=f"r{i}", prompt_token_ids=chat_prompts[i][: 18 + 5 * i], arrival_time=time.monotonic(),
                    params=SamplingParams(temperature=0, max_tokens=12 + 9 * i, ignore_eos=True)))
            for out in core.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            step += 1
        assert core.cache.num_free_blocks == core.cache.num_blocks
        return tokens, taken[0]

    (got, taken), (expected, _) = run(True), run(False)
    assert got == expected and len(got) == 4 and taken > 10


def test_the_device_buffer_path_continues_the_same_way(chat_prompts) -> None:
    """A CUDA graph's buffers move through torch ops, not the host's numpy views: the cpu platform's are taken
    through that path here (the views dropped)."""
    prompt, params = [chat_prompts[7][:33]], [dict(temperature=0, max_tokens=24, ignore_eos=True)]
    general, _ = engine_with("float32", False)
    steady, taken = engine_with("float32", True)
    steady.engine.executor.worker.runner.graphs._host = None
    assert generate(steady, prompt, params)[0].token_ids == generate(general, prompt, params)[0].token_ids
    assert taken[0] > 0
