"""Micro-benchmark of attention backends on one GPU: triton against sdpa, same batches, one table.

Each case is one step's attention for one layer (KV write plus attention) at a batch and context size;
times are medians of CUDA-event timings after warm-up. Both backends are created through frame's plugin
hooks on the cuda (or rocm) platform, and their outputs are compared so a fast wrong kernel shows up.

    python scripts/gpu_bench_attention.py [--dtype bfloat16] [--iters 50]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

import torch
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention import build_metadata

#: (name, [(context, new tokens)] per sequence)
CASES = [
    ("decode b=1 ctx=2048", [(2047, 1)]),
    ("decode b=32 ctx=512", [(511, 1)] * 32),
    ("decode b=32 ctx=2048", [(2047, 1)] * 32),
    ("decode b=128 ctx=1024", [(1023, 1)] * 128),
    ("prefill b=1 len=2048", [(0, 2048)]),
    ("prefill b=4 len=512", [(0, 512)] * 4),
    ("chunk b=2 ctx=1536+512", [(1536, 512)] * 2),
    ("mixed 1 chunk + 63 decodes", [(1024, 256)] + [(1023, 1)] * 63),
]
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def make_step(seqs: list[tuple[int, int]], heads: tuple[int, int], head_dim: int, block_size: int,
              dtype: torch.dtype, device: torch.device, seed: int = 0):
    """Tensors and metadata of one step, blocks shuffled over the pool."""
    rng = random.Random(seed)
    needed = [-(-(c + q) // block_size) for c, q in seqs]
    blocks = list(range(sum(needed)))
    rng.shuffle(blocks)
    tables, at = [], 0
    for n in needed:
        tables.append(blocks[at:at + n])
        at += n
    meta = build_metadata([c for c, _ in seqs], [q for _, q in seqs], tables, block_size, device)
    tokens = meta.num_tokens
    cache = (len(blocks), block_size, heads[1], head_dim)
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    return (rand(tokens, heads[0], head_dim), rand(tokens, heads[1], head_dim), rand(tokens, heads[1], head_dim),
            rand(*cache), rand(*cache), meta)


def time_ms(fn, iters: int, warmup: int = 5) -> float:
    """Median milliseconds of ``fn`` by CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_case(backend, step, iters: int) -> tuple[float, torch.Tensor]:
    """Median ms of one layer's forward on ``step``, and its output (for the agreement column)."""
    q, k, v, k_cache, v_cache, meta = step
    meta.extras.clear()
    backend.prepare(meta)
    elapsed = time_ms(lambda: backend.forward(q, k, v, k_cache, v_cache, meta), iters)
    return elapsed, backend.forward(q, k, v, k_cache, v_cache, meta).float()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--heads", default="32,8", help="query heads,KV heads")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--backends", default="sdpa,triton")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA or ROCm device is visible; this benchmark needs a GPU", file=sys.stderr)
        return 2
    hooks = PluginHooks(PluginRegistry())
    platform_name = "rocm" if torch.version.hip else "cuda"
    platform = hooks.create_platform(platform_name, None)
    platform.set_up()
    dtype = DTYPES[args.dtype]
    heads = tuple(int(h) for h in args.heads.split(","))
    names = args.backends.split(",")
    backends = {n: hooks.create_attention(n, num_heads=heads[0], num_kv_heads=heads[1], head_dim=args.head_dim,
                                          scale=args.head_dim**-0.5, dtype=dtype, platform=platform, options=None)
                for n in names}
    print(f"{platform.describe()} | {args.dtype}, heads {heads[0]}/{heads[1]}, head_dim {args.head_dim}, "
          f"block {args.block_size}, median of {args.iters} (ms per layer: KV write + attention)")
    header = f"{'case':<28}{'tokens':>8}" + "".join(f"{n + ' ms':>12}" for n in names)
    header += f"{'speedup':>10}{'max|diff|':>11}" if len(names) == 2 else ""
    print(header)
    print("-" * len(header))
    for label, seqs in CASES:
        step = make_step(seqs, heads, args.head_dim, args.block_size, dtype, platform.device)
        times, outs = zip(*(run_case(backend, step, args.iters) for backend in backends.values()), strict=True)
        row = f"{label:<28}{step[-1].num_tokens:>8}" + "".join(f"{t:>12.3f}" for t in times)
        if len(names) == 2:
            row += f"{times[0] / times[1]:>9.2f}x{(outs[0] - outs[1]).abs().max().item():>11.2e}"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
