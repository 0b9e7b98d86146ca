"""cpu_paged's attention kernel against the same kernel at another commit, alternating calls in one process.

    .venv/bin/python benchmarks/attention_ab.py [--ref main] [--rounds 15] [--threads 1] [--shapes mem,l2,engine]

The reference is ``git show REF:`` of the plugin's ``csrc/``, built once (cached by commit) with the plugin's flags
and every ``frame_cpu_paged`` renamed ``frame_cpu_paged_ref``, so both libraries load side by side; the other side
is this checkout's kernel. Each round times both on the same inputs, in alternating order, and the report gives
each side's median wall and process CPU time per layer, their ratio, and the largest difference between their
outputs. On a machine other jobs share, compare the CPU times at ``--threads 1``: with two threads a thread the
system pauses holds up the layer's end, and wall times measure the neighbours.

Shapes (SmolLM2-135M's heads: 9 query, 3 KV, dim 64; bfloat16; one decode token per sequence):
``mem``: 64 sequences of 200-400 keys on shuffled blocks, 30 layers' pools, so the KV comes from memory;
``l2``: the same on 40 blocks that stay in L2 (the kernel's compute alone); ``engine``: 64 sequences whose
prompts (50-400 tokens) lie on consecutive blocks and whose last 128 tokens' blocks interleave, as a fresh
engine's pool holds the mixed batch at its end, 30 layers; ``long``: one sequence of 2,000 keys, 30 layers;
``lone``: one sequence of 200 keys, 30 layers (a single stream's decode, split over the threads from 128 keys).
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import time
from pathlib import Path

import torch
from frame import native
from frame.testing.attention import build_metadata, make_batch
from frame_attention_cpu_paged import kernel

ROOT = Path(__file__).resolve().parents[1]
CSRC = "plugins/attention/cpu_paged/frame_attention_cpu_paged/csrc"
HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def reference_op(ref: str):
    """The attention op of ``ref``'s kernel (built on first use), and the commit it names."""
    commit = _git("rev-parse", ref).strip()[:12]
    directory = native.cache_root() / "kernels" / f"frame_cpu_paged_ref-{commit}"
    library = directory / "frame_cpu_paged_ref.so"
    if not library.is_file():
        from torch.utils import cpp_extension

        src = directory / "csrc"
        src.mkdir(parents=True, exist_ok=True)
        for name in _git("ls-tree", "--name-only", f"{ref}:{CSRC}").split():
            text = _git("show", f"{ref}:{CSRC}/{name}")
            (src / name).write_text(text.replace("frame_cpu_paged", "frame_cpu_paged_ref"))
        cpp_extension.load(name="frame_cpu_paged_ref", sources=[str(src / "paged_attention.cpp")],
                           extra_cflags=[*kernel.CFLAGS, "-fopenmp"], extra_ldflags=["-fopenmp"],
                           build_directory=str(directory), is_python_module=False, verbose=False)
    else:
        torch.ops.load_library(str(library))
    return torch.ops.frame_cpu_paged_ref.attention.default, commit


def tables_for(shape: str, contexts: list[int], rng: random.Random) -> tuple[list[list[int]], int] | None:
    """Block tables for the shape's layout and the pool's size in blocks; None: shuffled (make_batch's)."""
    needed = [(c + BLOCK) // BLOCK for c in contexts]  # the context and the new token
    if shape == "l2":
        return [rng.sample(range(40), n) for n in needed], 40
    if shape == "engine":
        tables, next_block = [], 0
        for c in contexts:
            prompt = (c - 128 + BLOCK - 1) // BLOCK
            tables.append(list(range(next_block, next_block + prompt)))
            next_block += prompt
        while any(len(t) < n for t, n in zip(tables, needed, strict=True)):
            for t, n in zip(tables, needed, strict=True):
                if len(t) < n:
                    t.append(next_block)
                    next_block += 1
        return tables, next_block
    return None


def case(shape: str):
    """(query, per-layer caches, metadata, KV bytes a layer reads) of one shape."""
    rng = random.Random(7)
    if shape == "long":
        contexts = [2000]
    elif shape == "lone":
        contexts = [200]
    elif shape == "engine":
        contexts = [rng.randint(50, 400) + 128 for _ in range(64)]
    else:
        contexts = [rng.randint(200, 400) for _ in range(64)]
    layers = 1 if shape == "l2" else 30
    layout = tables_for(shape, contexts, rng)
    if layout is None:
        _, _, _, k_cache, _, meta = make_batch(contexts, [1] * len(contexts), BLOCK, HEADS, KV_HEADS, DIM)
        blocks = k_cache.shape[0]
    else:
        meta = build_metadata(contexts, [1] * len(contexts), layout[0], BLOCK)
        blocks = layout[1]
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(len(contexts), HEADS, DIM, generator=gen).bfloat16()
    caches = [tuple(torch.randn(blocks, BLOCK, KV_HEADS, DIM, generator=gen).bfloat16() for _ in range(2))
              for _ in range(layers)]
    kv_bytes = sum(c + 1 for c in contexts) * KV_HEADS * DIM * 2 * 2
    return query, caches, meta, kv_bytes


def sweep(op, query, caches, meta, out) -> None:
    for k_cache, v_cache in caches:
        op(out, query, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, DIM**-0.5, 0, 0.0,
           meta.prompt)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref", default="main", help="the git commit (or branch) to compare against")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shapes", default="mem,l2,engine,long")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel.load()
    ops = {"ref": None, "this": torch.ops.frame_cpu_paged.attention.default}
    ops["ref"], commit = reference_op(args.ref)
    print(f"{args.threads} threads; ref = {args.ref} ({commit}), this = the checkout")
    for shape in args.shapes.split(","):
        query, caches, meta, kv_bytes = case(shape)
        outs = {side: torch.empty_like(query) for side in ops}
        wall: dict[str, list[float]] = {side: [] for side in ops}
        cpu: dict[str, list[float]] = {side: [] for side in ops}
        for side, op in ops.items():  # warm-up
            sweep(op, query, caches, meta, outs[side])
        for r in range(args.rounds):
            for side in (("ref", "this") if r % 2 == 0 else ("this", "ref")):
                t, c = time.perf_counter(), time.process_time()
                sweep(ops[side], query, caches, meta, outs[side])
                wall[side].append((time.perf_counter() - t) / len(caches) * 1e3)
                cpu[side].append((time.process_time() - c) / len(caches) * 1e3)
        w = {side: statistics.median(v) for side, v in wall.items()}
        c = {side: statistics.median(v) for side, v in cpu.items()}
        diff = (outs["ref"].float() - outs["this"].float()).abs().max().item()
        print(f"{shape:7s} per layer: wall {w['ref']:.3f} -> {w['this']:.3f} ms ({w['this'] / w['ref']:.3f}x), "
              f"CPU {c['ref']:.3f} -> {c['this']:.3f} ms ({c['this'] / c['ref']:.3f}x), "
              f"{kv_bytes / c['this'] / 1e6:.1f} GB/s of KV a CPU second; outputs differ by {diff:.1e}")


if __name__ == "__main__":
    main()
