"""One decode step of a SmolLM2-135M-shaped Llama (random weights) at batch 64: time and op table.

    .venv/bin/python benchmarks/profile_decode.py [--batch 64] [--dtype bfloat16] [--steps 5] [--profile]
    .venv/bin/python benchmarks/profile_decode.py --compare-with frame_attention_sdpa.backend:SdpaAttention
    .venv/bin/python benchmarks/profile_decode.py --no-native   # torch linears and norms, not the platform kernels

``--compare-with`` names another attention backend class (importable, e.g. an older copy of the sdpa plugin
renamed and put on ``PYTHONPATH``); both then run the same model, alternating, and their time ratio is printed.

No checkpoint or engine needed: contexts are drawn in ``[--min-ctx, --max-ctx]`` over shuffled blocks, so the
numbers isolate the model forward (attention, rotary, norms, MLP) from scheduling and sampling.
"""

from __future__ import annotations

import argparse
import importlib
import random
import time

import torch
from frame.layers import attach_platform_kernels
from frame.testing.attention import build_metadata
from frame_attention_cpu_paged.backend import CpuPagedAttention
from frame_model_llama.args import LlamaArgs
from frame_model_llama.model import LlamaModel
from frame_platform_cpu.platform import CpuOptions, CpuPlatform

SMOLLM2_135M = dict(
    architecture="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
    num_heads=9, num_kv_heads=3, head_dim=64, norm_eps=1e-5, tie_word_embeddings=True, qkv_bias=False,
    o_bias=False, mlp_bias=False, max_position_embeddings=8192, rope={"rope_type": "default", "rope_theta": 1e5},
    windows=(None,) * 30,
)


def build(batch: int, min_ctx: int, max_ctx: int, dtype: torch.dtype, block_size: int = 16, seed: int = 0,
          native: bool = True):
    """Model, inputs, caches and metadata of one pure-decode step (cpu_paged attention, the platform's kernels)."""
    rng = random.Random(seed)
    args = LlamaArgs(**SMOLLM2_135M)
    backend = CpuPagedAttention(args.num_heads, args.num_kv_heads, args.head_dim, args.head_dim ** -0.5, dtype)
    model = LlamaModel(args, backend, torch.device("cpu"), dtype)
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.data.fill_(1.0)
    attach_platform_kernels(model, CpuPlatform(CpuOptions(native_kernels=native)))
    contexts = [rng.randint(min_ctx, max_ctx) for _ in range(batch)]
    needed = [(c + 1 + block_size - 1) // block_size for c in contexts]
    blocks = list(range(1, sum(needed) + 1))
    rng.shuffle(blocks)
    tables, at = [], 0
    for n in needed:
        tables.append(blocks[at : at + n])
        at += n
    meta = build_metadata(contexts, [1] * batch, tables, block_size)
    shape = (sum(needed) + 1, block_size, args.num_kv_heads, args.head_dim)
    caches = [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in range(args.num_layers)]
    ids = torch.randint(0, args.vocab_size, (batch,))
    pos = torch.tensor(contexts, dtype=torch.int64)
    return model, backend, ids, pos, caches, meta


def step(model, backend, ids, pos, caches, meta) -> torch.Tensor:
    """One decode step as the runner runs it: prepare, forward, logits."""
    return model.compute_logits(model(ids, pos, caches, backend.build_metadata(meta)))


def compare(parts: tuple, target: str, steps: int) -> None:
    """Alternate this backend and ``target`` on the same model and step; print both medians and their ratio."""
    module, name = target.split(":")
    model, ours = parts[0], parts[1]
    theirs = getattr(importlib.import_module(module), name)(
        ours.num_heads, ours.num_kv_heads, ours.head_dim, ours.scale, ours.dtype
    )
    times: dict[str, list[float]] = {"current": [], target: []}
    for _ in range(steps + 1):
        for label, backend in (("current", ours), (target, theirs)):
            for layer in model.layers:
                layer.attn.backend = backend
            t = time.perf_counter()
            step(model, backend, *parts[2:])
            times[label].append((time.perf_counter() - t) * 1000)
    medians = {label: sorted(ts[1:])[len(ts[1:]) // 2] for label, ts in times.items()}
    for label, ms in medians.items():
        print(f"{label}: median {ms:.1f} ms per decode step")
    print(f"ratio {target} / current: {medians[target] / medians['current']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--min-ctx", type=int, default=50)
    parser.add_argument("--max-ctx", type=int, default=530)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--compare-with", default=None, help="module:Class of another attention backend")
    parser.add_argument("--no-native", action="store_true", help="torch's linears and norms, not the platform's")
    a = parser.parse_args()
    parts = build(a.batch, a.min_ctx, a.max_ctx, getattr(torch, a.dtype), native=not a.no_native)
    if a.compare_with:
        compare(parts, a.compare_with, a.steps)
        return
    step(*parts)
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step(*parts)
        times.append((time.perf_counter() - t) * 1000)
    print(f"decode step, batch {a.batch}, {a.dtype}: median {sorted(times)[len(times) // 2]:.1f} ms, "
          f"min {min(times):.1f} ms ({torch.get_num_threads()} threads)")
    if a.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step(*parts)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
