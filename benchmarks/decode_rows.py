"""A decode step's one-row (and few-row) products in every packed format the cpu platform serves here, each next to
the read floor of the same bytes measured in the same round: weight GB/s and the share of the floor.

    .venv/bin/python benchmarks/decode_rows.py [--rounds 3] [--threads 1,2] [--rows 1,2,4] [--formats q4_1,bf16]
        [--in-cache] [--huge-pages]

A step is SmolLM2-135M's linears (30 layers' distinct weights and the logits, as ``linear_dtypes.py``), so the
weights come from memory (or the last-level cache) as they do in the model. The floor is ``read_floor.cpp``
(``cpu_floor.cpp``'s read loop as a torch op) over a buffer of exactly the step's weight bytes, on the same
number of threads, its passes taken in turn with the step's: on a shared host only these same-round ratios mean
anything. One thread is timed in the thread's CPU time (time another process takes the core does not count), two
in wall time. The ggml formats use random blocks with sane float16 scales (the kernels' speed does not depend on
the values). ``--in-cache`` also times each layer shape alone, its weight in L2, in one core's CPU time: the
kernel's own rate and the call's fixed cost, without the memory system. bfloat16 runs
``kernels.bfloat16_linear`` (AMX tiles where the CPU has them) and, with AVX-512 BF16, the ``vdpbf16ps`` kernel
too. ``--huge-pages`` builds each format a second time with its packed weights on transparent huge pages (the
platform's ``huge_pages`` arena, as a served model has them; "NAME huge" in the output) and times both in each round;
the floor's buffer stays on 4 KiB pages. ``--replay`` runs each step as a served decode step does: recorded once
and replayed as the platform's native step program (no Python per call; with two threads the linears run as one
team, meeting at a barrier after each), so the per-call cost left is the kernel's own.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from frame import native
from frame.testing.ggml_blocks import random_blocks as kquant_blocks
from frame_platform_cpu import huge_pages, kernels, kquant, probe, quantized, repack
from frame_platform_cpu.record import record
from frame_platform_cpu.replay import compile_replay

#: (out features, in features, calls per step), as linear_dtypes.py.
SHAPES = [(960, 576, 30), (576, 576, 30), (3072, 576, 30), (576, 1536, 30), (49152, 576, 1)]
#: The super-block formats need inputs that are whole super-blocks of 256, which SmolLM2's 576 are not: they run 4
#: layers of Llama 3.2 1B's shapes (QKV, O, gate-up, down; 137 MB of q4_K, 200 of q6_K), from memory as well.
KQUANT_SHAPES = [(3072, 2048, 4), (2048, 2048, 4), (16384, 2048, 4), (2048, 8192, 4)]
GGML = ("q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "iq4_nl")

Linear = Callable[[torch.Tensor], torch.Tensor | None]


def random_blocks(fmt: str, out_f: int, in_f: int, gen: torch.Generator) -> torch.Tensor:
    """Random ggml blocks of ``fmt`` whose float16 scales (d, and m) are 2^-8."""
    code = quantized.GGML_FORMATS[fmt]
    size = repack.BLOCK_BYTES[code]
    blocks = torch.randint(0, 256, (out_f, in_f // 32, size), dtype=torch.uint8, generator=gen)
    halves = 2 if fmt in ("q4_1", "q5_1") else 1
    blocks[..., : 2 * halves] = torch.tensor([0x00, 0x1C] * halves, dtype=torch.uint8)  # 0x1C00 = 2^-8
    return blocks.reshape(out_f, -1)


def shapes_of(name: str) -> list[tuple[int, int, int]]:
    return KQUANT_SHAPES if name.startswith(("q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_xs")) else SHAPES


def builders() -> dict[str, tuple[Callable[[int, int, torch.Generator], Linear], float, torch.dtype]]:
    """format -> (build one linear, weight bytes per value, x's dtype). The K-quants (GB/s in the file's bytes): as
    served ("q4_k": repacked where the CPU has AVX-512 VNNI) and on the file's own blocks ("q4_k file")."""
    out: dict[str, tuple[Callable[[int, int, torch.Generator], Linear], float, torch.dtype]] = {}
    for fmt in GGML:
        code = quantized.GGML_FORMATS[fmt]
        out[fmt] = (lambda o, i, g, f=fmt, c=code: quantized._block_linear(random_blocks(f, o, i, g), c, None, None),
                    repack.BLOCK_BYTES[code] / 32, torch.bfloat16)
    seeds = iter(range(1 << 30))
    for fmt, size in (("q4_k", 144), ("q5_k", 176), ("q6_k", 210), ("q3_k", 110), ("q2_k", 84), ("iq4_xs", 136)):
        out[fmt] = (lambda o, i, g, f=fmt: quantized.ggml_linear(kquant_blocks(f, o, i, seed=next(seeds)), None),
                    size / 256, torch.bfloat16)
        out[f"{fmt} file"] = (lambda o, i, g, f=fmt: kquant.kquant_linear(kquant_blocks(f, o, i, seed=next(seeds)),
                                                                           None), size / 256, torch.bfloat16)
    if probe.has_avx512_bf16():
        out["bf16"] = (lambda o, i, g: kernels.bfloat16_linear(torch.randn(o, i, generator=g).bfloat16(), None), 2,
                       torch.bfloat16)
        op = torch.ops.frame_cpu.packed_linear.default

        def vdpbf16ps(o: int, i: int, g: torch.Generator) -> Linear:
            packed = kernels.pack_weight(torch.randn(o, i, generator=g).bfloat16())
            return lambda x: op(x, packed, None, o)

        out["bf16 vdpbf16ps"] = (vdpbf16ps, 2, torch.bfloat16)
    return out


def paired(floor: Callable[[], object], step: Callable[[], object], repeat: int, clock: Callable[[], float]
           ) -> tuple[float, float]:
    """The best of ``repeat`` floor reads and steps, taken in turn so that both see the same minutes."""
    best = [float("inf"), float("inf")]
    for _ in range(repeat):
        for which, fn in enumerate((floor, step)):
            start = clock()
            fn()
            best[which] = min(best[which], clock() - start)
    return best[0], best[1]


def replayed(linears: list[tuple[Linear, int]], xs: dict[int, torch.Tensor]) -> Callable[[], object]:
    """The step's calls recorded once and replayed as a native step program (``--replay``)."""

    def step() -> torch.Tensor:
        out = None
        for linear, i in linears:
            out = linear(xs[i])
        assert out is not None
        return out

    recording, _ = record(step)
    return compile_replay(recording)


def in_cache(steps: dict, rows: int, calls: int = 200) -> None:
    """Each shape's linear called ``calls`` times in a row, so its weight stays in L2: one core's CPU time per call
    (the kernel and the call's fixed cost, no memory stalls), as weight GB/s."""
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)
    for name, (linears, _, dtype) in steps.items():
        if shapes_of(name) is not SHAPES:
            continue
        per_value = _PER_VALUE[name]
        cells = []
        for (linear, i), (o, _, _) in zip(linears[::30], SHAPES[:-1], strict=False):
            x = torch.randn(rows, i, generator=gen).to(dtype)
            best = float("inf")
            for _ in range(7):
                start = time.thread_time()
                for _ in range(calls):
                    linear(x)
                best = min(best, (time.thread_time() - start) / calls)
            cells.append(f"{o}x{i} {best * 1e6:6.1f} us {o * i * per_value / best / 1e9:5.1f} GB/s")
        print(f"in L2, rows {rows}: {name:15s} " + " | ".join(cells), flush=True)


_PER_VALUE: dict[str, float] = {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5, help="steps timed per round (best is kept)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rows", default="1")
    parser.add_argument("--formats", default="", help="comma-separated names (default: all)")
    parser.add_argument("--in-cache", action="store_true", help="also time each shape with its weight in L2")
    parser.add_argument("--huge-pages", action="store_true",
                        help="also each format with its packed weights on transparent huge pages")
    parser.add_argument("--replay", action="store_true",
                        help="time each step replayed as a native step program (a served decode step's way)")
    args = parser.parse_args()
    kernels.load()
    native.load_library("frame_bench_floor", [Path(__file__).with_name("read_floor.cpp")], ("-O3", "-march=native"))
    wanted = [w for w in args.formats.split(",") if w]
    gen = torch.Generator().manual_seed(0)
    steps: dict[str, tuple[list[tuple[Linear, int]], float, torch.dtype]] = {}
    for name, (build, per_value, dtype) in builders().items():
        if wanted and name not in wanted:
            continue
        for pages in ("4k", "huge") if args.huge_pages else ("4k",):
            with huge_pages.placing(pages == "huge"):
                linears = [(build(o, i, gen), i) for o, i, calls in shapes_of(name) for _ in range(calls)]
            label = name if pages == "4k" else f"{name} huge"
            steps[label] = (linears, sum(o * i * calls for o, i, calls in shapes_of(name)) * per_value, dtype)
            _PER_VALUE[label] = per_value
    floor_buffer = torch.ones(int(max(b for _, b, _ in steps.values())) // 256 * 64)
    read_floor = torch.ops.frame_bench.read_floor.default
    print(f"isa {quantized.isa_path()}, amx {kernels.amx_usable()}; formats {list(steps)}")
    results: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for rnd in range(args.rounds):
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for name, (linears, step_bytes, dtype) in steps.items():
                floor = floor_buffer[: int(step_bytes) // 256 * 64]
                for rows in (int(r) for r in args.rows.split(",")):
                    xs = {i: torch.randn(rows, i, generator=gen).to(dtype) for _, i in linears}
                    step = (replayed(linears, xs) if args.replay
                            else lambda ls=linears, xs=xs: [f(xs[i]) for f, i in ls])
                    floor_s, step_s = paired(lambda f=floor: read_floor(f), step, args.repeat,
                                             time.thread_time if threads == 1 else time.perf_counter)
                    floor_gbs = floor.numel() * 4 / floor_s / 1e9
                    gbs = step_bytes / step_s / 1e9
                    results.setdefault((name, threads, rows), []).append((gbs, gbs / floor_gbs))
                    print(f"round {rnd} threads {threads} {name:15s} rows {rows}: {step_s * 1e3:6.2f} ms "
                          f"{gbs:5.1f} GB/s, floor {floor_gbs:5.1f} GB/s: {gbs / floor_gbs:5.1%}", flush=True)
    if args.in_cache:
        for rows in (int(r) for r in args.rows.split(",")):
            in_cache(steps, rows)
    print("\nmedian over rounds: weight GB/s, share of the same round's floor")
    for (name, threads, rows), values in results.items():
        print(f"threads {threads} {name:15s} rows {rows}: {statistics.median(v for v, _ in values):5.1f} GB/s "
              f"{statistics.median(r for _, r in values):5.1%}")


if __name__ == "__main__":
    main()
