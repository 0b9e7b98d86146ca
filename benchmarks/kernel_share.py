"""Where a decode token's wall time goes, sampled by Linux perf: the kernels, OpenMP's waits, everything else.

    .venv/bin/python benchmarks/kernel_share.py [--workload single_stream] [--dtype bfloat16] [--seconds 10]
        [--num-continuous-decode-steps 1] [--model FILE.gguf] [--probe-host]

torch.profiler times every op call and adds its own cost to each (about 430 calls a SmolLM2 decode step), so its
"outside the kernels" share overstates what a step spends there. This samples instead: a child process drives the
workload over and over, and ``perf record`` samples its threads at 2 kHz for ``--seconds``. The calling thread
never sleeps during a step (it runs its share of every parallel region, then the Python between them), so its
samples split its wall time by shared object:

- kernels: frame's native ops (``frame_cpu*.so``, the platform's and the attention backend's);
- OpenMP wait: ``libgomp``, the calling thread waiting at the end of a parallel region for the other threads;
- team barrier: the step program's spin barrier, where the threads of one team wait for each other between the
  calls of a stretch it runs in one region (``csrc/step_program.cpp``);
- outside: everything else (the TorchScript interpreter and dispatcher, Python, numpy, malloc, the kernel).

It needs ``perf`` and ``/proc/sys/kernel/perf_event_paranoid`` at 2 or lower (or root). The other threads' samples
are printed too: an OpenMP worker's ``libgomp`` share is the time it had nothing to do.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from rich.console import Console
from rich.table import Table

CHILD = textwrap.dedent("""
    import sys, time
    from frame.bench.driver import drive, warm_up
    from frame.config import build_config
    from frame.engine.core.engine_core import EngineCore
    from frame.workloads import load_workloads
    workload, dtype, quantization, steps, model = sys.argv[1:6]
    chosen = {"model": model} if model else {}
    engine = EngineCore(build_config(None, dtype=dtype, quantization=quantization, **chosen,
                                     num_continuous_decode_steps=int(steps)))
    requests = load_workloads().get(workload).generate(engine.source.tokenizer, 0)
    warm_up(engine)
    print("READY", flush=True)
    while True:
        engine.cache.reset()
        summary = drive(engine, requests).summary()
        print(f"TPOT {summary['tpot_ms']:.3f}", flush=True)
""")


def classify(dso: str, symbol: str) -> str:
    name = Path(dso.strip("()")).name
    if name.startswith("frame_") and name.endswith(".so"):
        return "team barrier" if "SpinBarrier" in symbol else "kernels"
    if name.startswith("libgomp") or name.startswith("libiomp"):
        return "OpenMP wait"
    return "outside"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="a checkpoint or .gguf file (default: the bundled SmolLM2)")
    parser.add_argument("--workload", default="single_stream")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--num-continuous-decode-steps", type=int, default=1,
                        help="the engine's num_continuous_decode_steps")
    parser.add_argument("--top", type=int, default=8, help="shared objects listed under 'outside'")
    parser.add_argument("--top-kernels", type=int, default=0, help="the kernels' busiest symbols to list")
    parser.add_argument("--probe-host", action="store_true",
                        help="measure the read floor and the CPUs' round trip before and after (host_probe.py): on a "
                             "VM whose host moves its CPUs, which placement the shares are from")
    args = parser.parse_args()
    console = Console()
    if shutil.which("perf") is None:
        console.print("[red]perf is not installed[/red]: install linux-perf (Debian) or linux-tools to sample.")
        return 1
    probe = None
    if args.probe_host:
        from host_probe import HostProbe  # beside this script; imported only when asked (it loads torch)

        probe = HostProbe()
        before = probe.measure()
    child = subprocess.Popen([sys.executable, "-c", CHILD, args.workload, args.dtype, args.quantization,
                              str(args.num_continuous_decode_steps), args.model],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        for line in child.stdout:
            if line.startswith("READY"):
                break
        with tempfile.TemporaryDirectory(prefix="frame-perf-") as tmp:
            data = Path(tmp) / "perf.data"
            record = subprocess.run(["perf", "record", "-F", "2000", "-p", str(child.pid), "-o", str(data), "--",
                                     "sleep", str(args.seconds)], capture_output=True, text=True)
            if record.returncode != 0 or not data.is_file():
                console.print(f"[red]perf record failed[/red]: {record.stderr.strip().splitlines()[-1:]}; "
                              "perf_event_paranoid must be 2 or lower (or run as root).")
                return 1
            script = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,ip,sym,dso"], capture_output=True,
                                    text=True, check=True).stdout
    finally:
        child.kill()
        tpots = [float(line.split()[1]) for line in child.stdout.read().splitlines() if line.startswith("TPOT")] \
            if child.stdout else []
        child.wait()
    # Per thread, samples by (group, shared object).
    by_thread: dict[int, collections.Counter[tuple[str, str]]] = collections.defaultdict(collections.Counter)
    kernel_symbols: collections.Counter[str] = collections.Counter()
    for line in script.splitlines():
        parts = line.split()  # tid, address, symbol (C++ names hold spaces), (shared object)
        if len(parts) >= 3 and parts[0].isdigit():
            symbol = " ".join(parts[2:-1])
            group = classify(parts[-1], symbol)
            by_thread[int(parts[0])][group, parts[-1]] += 1
            if group == "kernels" and int(parts[0]) == child.pid:
                kernel_symbols[symbol.replace("(anonymous namespace)", "").split("(")[0][:90]] += 1
    main_thread = by_thread.get(child.pid)
    if not main_thread:
        console.print("[red]perf caught no samples of the engine's thread[/red]")
        return 1
    table = Table(title=f"{args.workload}, {args.dtype}: the engine thread's {sum(main_thread.values())} samples "
                        f"over {args.seconds:g} s")
    for column in ("share", "where"):
        table.add_column(column)
    total = sum(main_thread.values())
    groups: collections.Counter[str] = collections.Counter()
    for (group, _), n in main_thread.items():
        groups[group] += n
    for group in ("kernels", "OpenMP wait", "team barrier", "outside"):
        table.add_row(f"{groups[group] / total:.1%}", group)
    outside = sorted(((n, dso) for (group, dso), n in main_thread.items() if group == "outside"), reverse=True)
    for n, dso in outside[: args.top]:
        table.add_row(f"  {n / total:.1%}", f"  {Path(dso.strip('()')).name or 'no object (JIT code, vdso)'}")
    for symbol, n in kernel_symbols.most_common(args.top_kernels):
        table.add_row(f"  {n / total:.1%}", f"  kernel {symbol}")
    console.print(table)
    for tid, counts in sorted(by_thread.items()):
        if tid == child.pid:
            continue
        n = sum(counts.values())
        wait = sum(c for (group, _), c in counts.items() if group in ("OpenMP wait", "team barrier"))
        console.print(f"thread {tid}: {n} samples, {wait / n:.0%} in OpenMP's wait or the team barrier")
    if probe is not None:
        after = probe.measure()
        moved = "" if before.same_placement(after) else " [yellow](the host moved the CPUs meanwhile)[/yellow]"
        console.print(f"host before: {before}; after: {after}{moved}")
    if tpots:
        tpots.sort()
        console.print(f"time per output token over {len(tpots)} runs: median {tpots[len(tpots) // 2]:.2f} ms "
                      f"(min {tpots[0]:.2f}, max {tpots[-1]:.2f}); pid {os.getpid()} sampled {child.pid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
