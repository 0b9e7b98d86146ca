"""Attention backends alone, one layer, SmolLM2-135M's heads (9 query, 3 KV, dim 64): time per call and rate.

    .venv/bin/python benchmarks/attention_kernels.py [--dtype bfloat16] [--backends cpu_paged,sdpa] [--layers 30]

Shapes: decode batches (64 sequences at contexts around 300 and 1000, one stream at 300 and 2000) and prefill steps (9
prompts of 225 tokens, one of 2000 and one of 8000, the last 2,048-token chunk of an 8,000-token prompt, 19 of
50-400); ``--shapes prefill`` runs only those whose label holds a word. Reports the median of several calls, the
multiply-add rate and the KV bytes read per second, so a kernel change shows whether it moved toward the compute or the
memory limit.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention import make_batch

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16
_lengths = random.Random(3)
PROMPTS_50_400 = [_lengths.randint(50, 400) for _ in range(19)]
SHAPES = {
    "decode 64 x ctx~300": ([random.Random(0).randint(200, 400) for _ in range(64)], [1] * 64),
    "decode 64 x ctx~1000": ([random.Random(1).randint(950, 1050) for _ in range(64)], [1] * 64),
    "decode 8 x ctx~300": ([random.Random(2).randint(200, 400) for _ in range(8)], [1] * 8),
    "decode 1 x ctx 300": ([300], [1]),
    "decode 1 x ctx 2000": ([2000], [1]),
    "prefill 9 x 225": ([0] * 9, [225] * 9),
    "prefill 1 x 2000": ([0], [2000]),
    "prefill 1 x 8000": ([0], [8000]),
    # The last 2,048-token chunk of an 8,000-token prompt prefilled in chunks.
    "prefill 2048 after 5952": ([5952], [2048]),
    # New prompts of 50-400 tokens (4,811 in all), as the mixed batch's first prefill steps hold them.
    "prefill 19 x 50-400": ([0] * 19, PROMPTS_50_400),
}


def case(context: list[int], new: list[int], dtype: torch.dtype):
    """One step's inputs, and its multiply-adds of exact causal attention (QK and PV) and KV bytes read once."""
    inputs = make_batch(context, new, BLOCK, HEADS, KV_HEADS, DIM, seed=2, dtype=dtype)
    macs = sum(n * c + n * (n + 1) // 2 for c, n in zip(context, new, strict=True)) * HEADS * DIM * 2
    kv_bytes = sum(c + n for c, n in zip(context, new, strict=True)) * KV_HEADS * DIM * 2 * inputs[3].element_size()
    return inputs, macs, kv_bytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--backends", default="cpu_paged,sdpa")
    parser.add_argument("--calls", type=int, default=7)
    parser.add_argument("--shapes", default="", help="only the shapes whose label contains one of these "
                        "comma-separated words (e.g. prefill)")
    parser.add_argument("--layers", type=int, default=1,
                        help="sweep this many copies of each case's KV, as a model's layers do, so the KV comes "
                             "from memory rather than the cache (30 for SmolLM2)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    hooks = PluginHooks(PluginRegistry())
    platform = hooks.create_platform("cpu", None)
    backends = {
        name: hooks.create_attention(name, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=DIM, scale=DIM**-0.5,
                                     dtype=dtype, platform=platform, options=None)
        for name in args.backends.split(",")
    }
    print(f"{torch.get_num_threads()} threads, {args.dtype}")
    for label, (context, new) in SHAPES.items():
        if args.shapes and not any(word in label for word in args.shapes.split(",")):
            continue
        inputs, macs, kv_bytes = case(context, new, dtype)
        layers = [inputs] + [(*inputs[:3], inputs[3].clone(), inputs[4].clone(), inputs[5])
                             for _ in range(args.layers - 1)]
        row = [f"{label:22s}"]
        for name, backend in backends.items():
            times = []
            for _ in range(args.calls):
                t = time.perf_counter()
                meta = backend.build_metadata(inputs[-1])
                for layer in layers:
                    backend.forward(*layer[:-1], meta)
                times.append((time.perf_counter() - t) / len(layers))
            s = sorted(times)[len(times) // 2]
            row.append(f"{name} {s * 1e3:8.2f} ms {2 * macs / s / 1e9:6.1f} GFLOP/s {kv_bytes / s / 1e9:5.1f} GB/s")
        print(" | ".join(row))


if __name__ == "__main__":
    main()
