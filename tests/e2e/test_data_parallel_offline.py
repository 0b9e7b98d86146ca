"""Data parallelism offline: `LLM(data_parallel_size=2)` generates what one core does, spreading prompts over both
cores; and an experiment cell at data_parallel_size 2 runs a multi-turn workload through its router, reporting how
many prompts each core got and the prefix hits its routing earned."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from frame import LLM, SamplingParams
from frame.bench.experiment import ExperimentRunner, ExperimentSpec

ENGINE = {"max_model_len": 256, "num_kv_blocks": 64, "dtype": "float32", "platform_options": {"threads": 1}}


def test_two_cores_generate_what_one_core_does(chat_prompts) -> None:
    prompts = [{"prompt_token_ids": p} for p in chat_prompts[:6]]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = [r.outputs[0].token_ids for r in LLM(**ENGINE).generate(prompts, greedy)]
    asyncio.run(asyncio.sleep(0))  # leaves this thread without an event loop, as any earlier asyncio.run does
    llm = LLM(data_parallel_size=2, router="least_loaded", **ENGINE)
    try:
        assert [r.outputs[0].token_ids for r in llm.generate(prompts, greedy)] == expected
        assert sorted(llm.engine.routed()) == [3, 3]  # sent at once: each core's load counts what it was sent
        by_rank = llm.engine.stats_by_rank()
        assert sorted(by_rank) == [0, 1] and all(s.generation_tokens == 18 for s in by_rank.values())
        assert llm.stats().generation_tokens == 36
    finally:
        llm.shutdown()


def test_an_experiment_cell_at_two_cores_routes_conversations_to_their_cache() -> None:
    spec = ExperimentSpec(name="dp", engine={**ENGINE, "data_parallel_size": 2, "router": "prefix_affinity"},
                          workloads=[{"name": "multi_turn", "params": {
                              "num_conversations": 2, "num_turns": 2, "system_len": 40, "user_len": [8, 12],
                              "reply_len": [8, 12], "max_tokens": 2}}])
    runner = ExperimentRunner(spec)
    [(options, workload)] = runner.plan()
    row = runner.run_cell(options, workload)
    assert row["error"] is None, row.get("traceback")
    assert row["routed"] == [2, 2]  # a conversation per core, both turns on it
    # Turn 2 of each conversation finds turn 1's full blocks (at least the 40-token system prompt's two) cached.
    assert row["prompt_tokens_cached"] >= 2 * 32 and row["output_tokens"] == 8


def test_a_script_that_drops_two_cores_leaves_no_pending_task_behind() -> None:
    script = ("from frame import LLM, SamplingParams\n"
              f"llm = LLM(data_parallel_size=2, **{ENGINE!r})\n"
              "llm.generate([{'prompt_token_ids': [1, 2, 3]}], SamplingParams(max_tokens=2))\n"
              "del llm\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Task was destroyed but it is pending" not in out.stderr
