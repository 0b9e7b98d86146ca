"""Recorded decode steps: fixed buffers, bucket padding and the scratch block give the eager step's tokens.

The cpu platform records for real (``frame_platform_cpu.graphs``: the step's op calls, replayed by TorchScript):
later tests check its tokens, float32 and bfloat16, against the eager step's, for dense weights and for GGUFs
whose weights and token embedding stay packed (the bundled model's Q4_1 and Q8_0, and a tiny Llama in six
K-quant types written here). The first checks the runner's side
alone with a TEST DOUBLE recorder (``ReplayByRerun``): "recording" runs the step function once and "replaying"
calls it again, reading the runner's fixed buffers exactly as a CUDA graph replay would: which steps replay, the
bucket padding, that padding rows touch only the scratch block. The CUDA recorder (``frame_platform_cuda``,
torch.cuda.CUDAGraph) is checked by a gpu-marked test in that plugin and by scripts/gpu_check.sh.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from frame import LLM, SamplingParams
from frame.engine.core.loop import ready_message
from frame.engine.worker.graphs import capture_sizes
from frame.engine.worker.sampler import Sampler
from frame.layers import VocabParallelEmbedding
from frame.summary import startup_summary
from frame.testing.ggml_blocks import random_blocks
from frame.testing.gguf import write_text_model_keys, write_tiny_tokenizer
from frame_platform_cpu.platform import CpuPlatform
from transformers import LlamaConfig

DTYPES = ["float32", pytest.param("bfloat16", marks=pytest.mark.skipif(
    torch.bfloat16 not in CpuPlatform().supported_dtypes, reason="the CPU has no bfloat16 path"))]


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


def token_table(llm: LLM) -> torch.Tensor:
    """The model's token embedding weight (on the meta device where it stays packed, its blocks in ``.packed``)."""
    model = llm.engine.executor.worker.runner.model
    return next(m for m in model.modules() if isinstance(m, VocabParallelEmbedding)).weight


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


def test_steps_recorded_at_start_over_the_padding_rows_give_the_eager_tokens(chat_prompts) -> None:
    """``record_graphs_at_start`` (frame serve's default) records every bucket before any request, each row of it
    decoding into the scratch block; replays with real rows must still give the eager step's tokens."""
    prompts = [p[: 20 + 7 * i] for i, p in enumerate(chat_prompts[:3])]
    args = dict(dtype="float32", attn="cpu_paged", max_model_len=256, max_num_seqs=4, quantization="none")
    eager = greedy(LLM(**args, cuda_graphs=False), prompts, 8)
    llm = LLM(**args, record_graphs_at_start=True)
    replays = llm.engine.executor.worker.runner.graphs.replays
    assert sorted(replays) == [1, 2, 4] and all(replays[size].calls > 300 for size in replays)
    ready = ready_message(llm.engine, os.getpid())
    assert "up to 4, all recorded at start" in startup_summary(ready, llm.config, "inproc")
    assert greedy(llm, prompts, 8) == eager
    assert greedy(llm, prompts[:1], 5) == [eager[0][:5]]


def test_plain_greedy_steps_take_their_tokens_from_the_recorded_steps_argmax(monkeypatch: pytest.MonkeyPatch,
                                                                               chat_prompts) -> None:
    """The cpu platform's greedy kernel ends each recorded step; a replayed step whose rows are all plain greedy
    hands the sampler those tokens, and one with a sampled row still draws (the same draws as eager steps)."""
    prompts = [p[: 20 + 7 * i] for i, p in enumerate(chat_prompts[:3])]
    args = dict(dtype="float32", attn="cpu_paged", max_model_len=256, max_num_seqs=4, quantization="none")
    eager = LLM(**args, cuda_graphs=False)
    llm = LLM(**args)
    assert llm.engine.executor.worker.runner.graphs.greedy is not None
    handed: list[bool] = []
    sample = Sampler.__call__

    def spy(sampler, logits, batch, rows, greedy=None):
        handed.append(greedy is not None)
        if greedy is not None:
            assert greedy.tolist() == logits.numpy().argmax(-1).tolist()
        return sample(sampler, logits, batch, rows, greedy)

    monkeypatch.setattr(Sampler, "__call__", spy)
    assert greedy(llm, prompts, 10) == greedy(eager, prompts, 10)
    assert sum(handed) >= 8  # the replayed decode steps; the prefill steps ran eagerly
    mixed = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
             SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True)]
    requests = [{"prompt_token_ids": p} for p in prompts[:2]]
    assert ([r.outputs[0].token_ids for r in llm.generate(requests, mixed)]
            == [r.outputs[0].token_ids for r in eager.generate(requests, mixed)])


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
    llm = LLM(dtype="float32", max_model_len=256, max_num_seqs=2, quantization="none",
              platform_options={"decode_graphs": recorded})
    ready = ready_message(llm.engine, os.getpid())
    row = next(line for line in startup_summary(ready, llm.config, "inproc").splitlines() if "decode graphs" in line)
    if recorded:
        assert ready.decode_graphs == [1, 2] and row.endswith("on, 2 batch sizes up to 2")
    else:
        assert ready.decode_graphs == [] and "none recorded here" in row and "eagerly" in row


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_gguf_records_its_decode_steps_and_gives_the_eager_tokens(dtype: str, chat_prompts) -> None:
    # The token embedding stays packed too: the cpu platform looks its rows up in one native op (packed_rows),
    # where the core's reference reads the ids back and dequantizes through numpy, which no recording repeats.
    prompts = [p[: 20 + 7 * i] for i, p in enumerate(chat_prompts[:5])]
    args = dict(dtype=dtype, attn="cpu_paged", max_model_len=256, max_num_seqs=8, quantization="gguf")
    eager = greedy(LLM(**args, cuda_graphs=False), prompts, 10)
    llm = LLM(**args)
    table = token_table(llm)
    assert table.device.type == "meta" and table.packed.format in ("q4_1", "q8_0")
    assert greedy(llm, prompts, 10) == eager
    assert greedy(llm, prompts[:1], 6) == [eager[0][:6]]
    replays = llm.engine.executor.worker.runner.graphs.replays
    assert replays[8].calls > 300 and replays[1].calls > 300


#: Each K-quant tensor's type (the fused QKV mixes three, as llama.cpp's Q4_K_M mixes q4_K and q6_K).
KQUANT_TYPES = {"token_embd": "q4_k", "output": "q6_k", "attn_q": "q4_k", "attn_k": "q5_k", "attn_v": "q6_k",
                "attn_output": "q3_k", "ffn_gate": "q2_k", "ffn_up": "iq4_xs", "ffn_down": "q4_k"}


def write_kquant_llama(path: Path, config: LlamaConfig) -> None:
    """A Llama GGUF whose matrices are random blocks of the K-quant types (``frame.testing.ggml_blocks``: gguf-py
    writes none of them, and no llama.cpp is at hand); the test compares the engine with itself, eager and
    replayed."""
    writer = gguf.GGUFWriter(path, "llama")
    write_text_model_keys(writer, config, "f32")
    write_tiny_tokenizer(writer, config.vocab_size)
    hidden, kv, inter = config.hidden_size, config.num_key_value_heads * config.head_dim, config.intermediate_size
    shapes = {"token_embd": (config.vocab_size, hidden), "output": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        for name, shape in {"attn_q": (hidden, hidden), "attn_k": (kv, hidden), "attn_v": (kv, hidden),
                            "attn_output": (hidden, hidden), "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden),
                            "ffn_down": (hidden, inter)}.items():
            shapes[f"blk.{i}.{name}"] = shape
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for seed, (name, (rows, inputs)) in enumerate(shapes.items()):
        fmt = KQUANT_TYPES[name.rsplit(".", 1)[-1]]
        blocks = random_blocks(fmt, rows, inputs, seed).tensors["blocks"].numpy()
        writer.add_tensor(f"{name}.weight", blocks, raw_dtype=gguf.GGMLQuantizationType[fmt.upper()])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_kquant_gguf_records_its_decode_steps_and_gives_the_eager_tokens(dtype: str, tmp_path: Path) -> None:
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=97, max_position_embeddings=128)
    path = tmp_path / "tiny-kquant.gguf"
    write_kquant_llama(path, config)
    prompts = [[1, 5 + 3 * i, 9, 14 + i, 3, 27 + 2 * i][: 3 + i] for i in range(3)]  # 3 requests: bucket 4
    args = dict(model=str(path), dtype=dtype, max_model_len=128, max_num_seqs=4, quantization="gguf")
    eager = greedy(LLM(**args, cuda_graphs=False), prompts, 8)
    llm = LLM(**args)
    assert token_table(llm).device.type == "meta" and token_table(llm).packed.format == "q4_k"
    assert greedy(llm, prompts, 8) == eager
    assert len({tuple(tokens) for tokens in eager}) == 3  # the prompts lead somewhere different
    replays = llm.engine.executor.worker.runner.graphs.replays
    assert replays[4].calls > 50 and replays[1].calls is None
