"""A decode step eagerly (Python per layer) against the cpu platform's recorded replay: time, CPU time, and the
share of the step spent outside the kernels.

    .venv/bin/python benchmarks/decode_graph.py [--batch 1] [--dtype bfloat16] [--rounds 20] [--threads 1]
    .venv/bin/python benchmarks/decode_graph.py --batch 49 --max-num-seqs 64   # 15 padding rows

Builds profile_decode.py's SmolLM2-135M-shaped model (random weights, contexts in ``[--min-ctx, --max-ctx]``),
then runs the step both ways, alternating, through the runner's own :class:`frame.engine.worker.graphs.DecodeGraphs`
(fixed buffers, batch-size buckets) with ``CpuPlatform.capture_graph``. Both answers must be equal, bit for bit.
Per step it prints the median wall time, the process CPU time (both threads: compare this on a shared machine) and,
under torch.profiler, the time inside the kernels (``frame_cpu*`` ops with what they call: linears, attention,
norms, rotary) and outside them (everything else: Python, torch dispatch, views, allocation, the profiler's own
cost per op).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import torch
from frame.engine.worker.graphs import DecodeGraphs
from frame_platform_cpu.platform import CpuPlatform
from profile_decode import build

KERNEL_PREFIX = "frame_cpu"  # frame_cpu:: and frame_cpu_paged::


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def kernel_split(run, steps: int = 10) -> tuple[float, float]:
    """(ms per step inside kernels, ms per step outside them), under torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        wall = (time.perf_counter() - start) / steps * 1000
    # Inclusive: a kernel's allocation of its own output is part of it.
    inside = sum(e.cpu_time_total for e in prof.key_averages() if e.key.startswith(KERNEL_PREFIX))
    inside_ms = inside / steps / 1000
    return inside_ms, wall - inside_ms


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag, default in (("--batch", 1), ("--min-ctx", 50), ("--max-ctx", 530), ("--rounds", 20)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, every core)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="the runner's bucket limit (default --batch); above it, a batch between buckets replays "
                             "the next bucket with padding rows")
    a = parser.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model, backend, ids, pos, caches, meta = build(a.batch, a.min_ctx, a.max_ctx, getattr(torch, a.dtype))
    block_size = caches[0][0].shape[1]
    # profile_decode hands out blocks from 1: block 0 is the scratch block no sequence owns.
    graphs = DecodeGraphs(model, backend, caches, torch.device("cpu"), max_num_seqs=a.max_num_seqs or a.batch,
                          max_model_len=a.max_ctx + 1, block_size=block_size, scratch_block=0,
                          capture=CpuPlatform().capture_graph)
    host = (ids.numpy(), pos.numpy(), meta.slot_mapping.numpy(), meta.seq_lens.numpy(),
            meta.block_tables.numpy().astype(np.int32))
    eager_meta = backend.build_metadata(meta)
    runs = {
        "eager": lambda: model.compute_logits(model(ids, pos, caches, eager_meta)),
        "replay": lambda: graphs.run(*host),
    }
    with torch.inference_mode():
        answers = {name: run().clone() for name, run in runs.items()}  # the replay's first call records
        answers = {name: run().clone() for name, run in runs.items()}
        if not torch.equal(answers["eager"], answers["replay"]):
            raise SystemExit("the replay's logits differ from the eager step's")
        wall: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(a.rounds):
            for name, run in runs.items():
                start, start_cpu = time.perf_counter(), cpu_seconds()
                run()
                wall[name].append((time.perf_counter() - start) * 1000)
                cpu[name].append((cpu_seconds() - start_cpu) * 1000)
        print(f"decode step, batch {a.batch}, {a.dtype}, {torch.get_num_threads()} threads, {a.rounds} rounds "
              "alternating (medians per step)")
        for name, run in runs.items():
            inside, outside = kernel_split(run)
            print(f"{name:>7}: wall {statistics.median(wall[name]):6.2f} ms, CPU {statistics.median(cpu[name]):6.2f}"
                  f" ms | profiled: kernels {inside:6.2f} ms, outside {outside:5.2f} ms"
                  f" ({100 * outside / (inside + outside):4.1f}%)")


if __name__ == "__main__":
    main()
