"""Profile frame's engine on issue #6's workloads: wall time per phase and a torch.profiler operator table.

    .venv/bin/python benchmarks/profile_step.py --workload mixed_batch --dtype bfloat16 [--profile]
    .venv/bin/python benchmarks/profile_step.py --workload single_stream --quantization gguf [--eager]

Builds an EngineCore the way ``frame bench`` does, warms it up, then drives the workload once (timed) and,
with ``--profile``, again under torch.profiler, printing the operators that took the most self CPU time. The
per-step split (schedule, prepare, forward, logits+sample, update) comes from timing the runner's pieces. It also
prints the process CPU time per output token (every thread: what to compare on a shared machine) and, where the
platform records decode steps, each recorded step's op calls (0: it could not be recorded and ran eagerly).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections import defaultdict
from typing import Any

import torch
from frame.bench.driver import drive, warm_up
from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.workloads.batch import BATCH_WORKLOADS
from frame.workloads.sharing import SHARING_WORKLOADS

WORKLOADS = {w.name: w for w in [*BATCH_WORKLOADS, *SHARING_WORKLOADS]}
ISSUE_PARAMS: dict[str, dict[str, Any]] = {
    "mixed_batch": {},
    "single_stream": {},
    "shared_prefix": {"num_requests": 64, "max_tokens": 64},
}


def _timed(phases: dict[str, float], name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] += time.perf_counter() - t
    return wrapper


def instrument(engine: EngineCore) -> dict[str, float]:
    """Wrap the step's pieces with timers; returns the accumulating ``phase -> seconds`` dict."""
    phases: dict[str, float] = defaultdict(float)
    runner = engine.executor.worker.runner  # type: ignore[attr-defined]  # the in-process executor's
    engine.scheduler.schedule = _timed(phases, "schedule", engine.scheduler.schedule)  # type: ignore[method-assign]
    engine.scheduler.update = _timed(phases, "update", engine.scheduler.update)  # type: ignore[method-assign]
    runner.apply_plan = _timed(phases, "apply_plan", runner.apply_plan)  # type: ignore[method-assign]
    runner.gather = _timed(phases, "gather", runner.gather)  # type: ignore[method-assign]
    runner.to_device = _timed(phases, "to_device", runner.to_device)  # type: ignore[method-assign]
    runner.attention.build_metadata = _timed(phases, "attn.metadata",  # type: ignore[method-assign]
                                             runner.attention.build_metadata)
    runner.model.forward = _timed(phases, "forward", runner.model.forward)  # type: ignore[method-assign]
    if runner.graphs is not None:  # a replayed decode step: forward and logits in one
        runner.graphs.run = _timed(phases, "replay", runner.graphs.run)  # type: ignore[method-assign]
    runner.model.compute_logits = _timed(phases, "logits", runner.model.compute_logits)  # type: ignore[method-assign]
    runner.sampler.__class__.__call__ = _timed(phases, "sample", runner.sampler.__class__.__call__)  # type: ignore
    engine.step = _timed(phases, "step", engine.step)  # type: ignore[method-assign]
    return phases


def log_steps(engine: EngineCore) -> list[tuple[int, int, float]]:
    """Record each step's scheduled sequences, batched tokens and wall milliseconds."""
    log: list[tuple[int, int, float]] = []
    schedule, step = engine.scheduler.schedule, engine.step

    def logged_schedule() -> Any:
        out = schedule()
        log.append((out.num_scheduled, out.num_batched_tokens, 0.0))
        return out

    def logged_step(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            if log:
                log[-1] = (*log[-1][:2], (time.perf_counter() - t) * 1e3)

    engine.scheduler.schedule = logged_schedule  # type: ignore[method-assign]
    engine.step = logged_step  # type: ignore[method-assign]
    return log


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="mixed_batch", choices=sorted(WORKLOADS))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cache", default="hashchain")
    parser.add_argument("--attn", default="auto")
    parser.add_argument("--quantization", default="none",
                        help="a quantization plugin (gguf keeps the GGUF's blocks; default none: dense weights)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--eager", action="store_true", help="no recorded decode steps (--no-cuda-graphs)")
    parser.add_argument("--profile", action="store_true", help="also run once under torch.profiler")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--shapes", action="store_true", help="the op table per input shape")
    parser.add_argument("--steps", action="store_true", help="print every step: sequences, tokens, milliseconds")
    parser.add_argument("--workload-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a workload parameter (JSON value), e.g. num_requests=32 or prompt_len=[200,200]")
    args = parser.parse_args()
    params = {**ISSUE_PARAMS.get(args.workload, {}),
              **{k: json.loads(v) for k, v in (opt.split("=", 1) for opt in args.workload_opt)}}

    t0 = time.perf_counter()
    engine = EngineCore(build_config(
        None, dtype=args.dtype, cache=args.cache, attn=args.attn, quantization=args.quantization,
        platform_options={"threads": args.threads} if args.threads else None, cuda_graphs=not args.eager,
    ))
    print(f"engine built in {time.perf_counter() - t0:.2f}s; torch threads {torch.get_num_threads()}, "
          f"interop {torch.get_num_interop_threads()}, dtype {engine.selection.dtype}, "
          f"attention {engine.selection.attn}")
    requests = WORKLOADS[args.workload].generate(engine.source.tokenizer, **params)
    warm_up(engine)
    for _ in range(args.repeat):
        engine.cache.reset()
        phases = instrument(engine) if _ == args.repeat - 1 else None
        log = log_steps(engine) if args.steps and phases is not None else None
        cpu = time.process_time()
        result = drive(engine, requests)
        cpu = time.process_time() - cpu
        tokens = result.summary()["output_tokens"]
        print(f"process CPU time {cpu:.2f}s (every thread), {cpu / tokens * 1e3:.2f} ms per output token")
        if log:
            print("steps (sequences/tokens/ms): " + " ".join(f"{n}/{t}/{ms:.0f}" for n, t, ms in log))
        s = result.summary()
        print(f"{args.workload}: { {k: round(v, 3) for k, v in s.items()} }")
    assert phases is not None
    graphs = engine.executor.worker.runner.graphs  # type: ignore[attr-defined]
    if graphs is not None:  # calls None: never used; 0: the step could not be recorded and ran eagerly
        print("recorded decode steps (batch size: op calls): "
              + ", ".join(f"{size}: {r.calls}" for size, r in sorted(graphs.replays.items()) if r.calls is not None))
    total = phases.pop("step")
    print(f"step total {total:.2f}s; " + ", ".join(f"{k} {v:.2f}s ({v / total:.0%})" for k, v in phases.items()))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.profile:
        engine.cache.reset()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            drive(engine, requests)
        print(prof.key_averages(group_by_input_shape=args.shapes).table(sort_by="self_cpu_time_total",
                                                                       row_limit=args.rows))


if __name__ == "__main__":
    main()
