"""Recorded decode steps: fixed buffers, bucket padding and the scratch block give the eager step's tokens.

The cpu platform records for real (``frame_platform_cpu.graphs``: the step's op calls, replayed by TorchScript):
the last test checks its tokens, float32 and bfloat16, against the eager step's. The first checks the runner's side
alone with a TEST DOUBLE recorder (``ReplayByRerun``): "recording" runs the step function once and "replaying"
calls it again, reading the runner's fixed buffers exactly as a CUDA graph replay would: which steps replay, the
bucket padding, that padding rows touch only the scratch block. The CUDA recorder (``frame_platform_cuda``,
torch.cuda.CUDAGraph) is checked by a gpu-marked test in that plugin and by scripts/gpu_check.sh.
"""

from __future__ import annotations

import pytest
from frame import LLM, SamplingParams
from frame.engine.worker.graphs import capture_sizes
from frame_platform_cpu.platform import CpuPlatform


class ReplayByRerun:
    """TEST DOUBLE of a platform's graph recorder (see the module docstring)."""

    def __init__(self) -> None:
        self.recorded = 0
        self.replayed = 0

    def __call__(self, fn):
        fn()
        self.recorded += 1

        def replay():
            self.replayed += 1
            return fn()

        return replay


def greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [r.outputs[0].token_ids for r in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def test_capture_sizes_cover_the_running_limit() -> None:
    assert capture_sizes(256) == [1, 2, 4, 8, *range(16, 257, 16)]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20] and capture_sizes(3) == [1, 2, 3]


def test_replayed_decode_steps_give_the_eager_tokens(monkeypatch: pytest.MonkeyPatch, chat_prompts) -> None:
    prompts = [p[: 20 + 7 * i] for i, p in enumerate(chat_prompts[:6])] + chat_prompts[:3]  # 9 requests: bucket 16
    args = dict(dtype="float32", attn="cpu_paged", max_model_len=256, max_num_seqs=16)
    eager = greedy(LLM(**args, cuda_graphs=False), prompts, 12)
    recorder = ReplayByRerun()
    monkeypatch.setattr(CpuPlatform, "capture_graph", lambda platform, fn: recorder(fn))
    llm = LLM(**args)
    runner = llm.engine.executor.worker.runner
    assert runner.graphs is not None and recorder.recorded == len(capture_sizes(16))
    assert runner.kv.shape[2] == llm.engine.num_blocks + 1  # the scratch block, outside the cache's pool
    assert greedy(llm, prompts, 12) == eager
    assert recorder.replayed >= 10  # the pure decode steps replayed; prefill steps ran eagerly
    assert greedy(llm, prompts[:3], 5) == [tokens[:5] for tokens in eager[:3]]  # bucket 4, three real rows


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_cpu_platforms_recorded_steps_give_the_eager_tokens(dtype: str, chat_prompts) -> None:
    prompts = [p[: 20 + 7 * i] for i, p in enumerate(chat_prompts[:5])]  # 5 requests: bucket 8, 3 padding rows
    args = dict(dtype=dtype, attn="cpu_paged", max_model_len=256, max_num_seqs=8, quantization="none")
    eager = greedy(LLM(**args, cuda_graphs=False), prompts, 10)
    llm = LLM(**args)
    replays = llm.engine.executor.worker.runner.graphs.replays
    assert greedy(llm, prompts, 10) == eager
    assert greedy(llm, prompts[:1], 6) == [eager[0][:6]]
    # Both buckets recorded a step of a few hundred op calls (never fell back to running eagerly).
    assert replays[8].calls > 300 and replays[1].calls > 300 and replays[2].calls is None


def test_a_dropped_engine_frees_its_weights_and_kv_pool(chat_prompts) -> None:
    """Recorded steps must not pin the engine: every LLM a process made and dropped kept its weights and KV pool
    while the step closures held the graphs object through its own replays (a test worker grew to 11 GB)."""
    import gc
    import weakref

    llm = LLM(dtype="float32", attn="cpu_paged", max_model_len=256, max_num_seqs=2, quantization="none")
    greedy(llm, chat_prompts[:1], 4)
    runner = llm.engine.executor.worker.runner
    assert runner.graphs is not None and runner.graphs.replays[1].calls  # a step was recorded and replayed
    pool, weight = weakref.ref(runner.kv_caches[0][0]), weakref.ref(next(runner.model.parameters()))
    del llm, runner
    gc.collect()
    assert pool() is None and weight() is None


@pytest.mark.parametrize("recorded", [True, False])
def test_the_startup_summary_says_whether_steps_are_recorded(recorded: bool) -> None:
    import os

    from frame.engine.core.loop import ready_message
    from frame.summary import startup_summary

    llm = LLM(dtype="float32", max_model_len=256, max_num_seqs=2, quantization="none",
              platform_options={"decode_graphs": recorded})
    ready = ready_message(llm.engine, os.getpid())
    row = next(line for line in startup_summary(ready, llm.config, "inproc").splitlines() if "decode graphs" in line)
    if recorded:
        assert ready.decode_graphs == [1, 2] and row.endswith("on, 2 batch sizes up to 2")
    else:
        assert ready.decode_graphs == [] and "none recorded here" in row and "eagerly" in row
