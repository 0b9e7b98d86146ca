"""The Ray path against the child-process path: `frame serve --data-parallel-size N` both ways, one run.

    .venv/bin/python benchmarks/dp_backends.py [--rounds 2] [--data-parallel-size 2] [--concurrency 16]

Each round starts `frame serve` over child-process engine cores (`--distributed-backend mp`), drives it with
`frame bench serve` (the ``words`` dataset: ``--num-prompts`` prompts, ``--concurrency`` in flight, greedy,
``ignore_eos``), stops it, and does the same over Ray actors (`--distributed-backend ray`, a local Ray the server
starts and stops), so both forms run on the same machine in the same state; the order alternates from round to
round. Only one server lives at a time. Reported per backend: the medians over rounds of output throughput,
TTFT and TPOT, the CPU time per output token of the API server process and of everything it started (engine
cores; under Ray also Ray's own daemons and actors), and the Ray/mp throughput ratio (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from compare_serve import Server
from rich.console import Console
from rich.table import Table

METRICS = ("output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "output_tokens",
           "api_cpu_s", "engine_cpu_s")


def serve_command(args: argparse.Namespace, backend: str) -> list[str]:
    return [str(Path(sys.executable).with_name("frame")), "serve", "--port", str(args.port), "--dtype", args.dtype,
            "--data-parallel-size", str(args.data_parallel_size), "--distributed-backend", backend,
            "--max-model-len", str(args.max_model_len), *args.frame_arg]


def measure(args: argparse.Namespace, backend: str, logs: Path) -> dict[str, Any]:
    """Start one server, run `frame bench serve` against it, stop it; the benchmark's summary."""
    server = Server(backend, serve_command(args, backend), args.port, {"OMP_WAIT_POLICY": "PASSIVE"},
                    logs / f"{backend}.log")
    try:
        server.wait_ready()
        out = logs / f"{backend}.json"
        bench = [str(Path(sys.executable).with_name("frame")), "bench", "serve", "--base-url", server.base_url,
                 "--num-prompts", str(args.num_prompts), "--concurrency", str(args.concurrency),
                 "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--json", str(out)]
        api0, engine0 = server.cpu_split()
        run = subprocess.run(bench, capture_output=True, text=True, timeout=args.timeout)
        api1, engine1 = server.cpu_split()
        if run.returncode != 0 or not out.is_file():
            raise RuntimeError(f"frame bench serve failed against {backend} (exit {run.returncode}): "
                               f"{run.stdout[-1000:]} {run.stderr[-1000:]}")
        return {**json.loads(out.read_text()), "api_cpu_s": api1 - api0, "engine_cpu_s": engine1 - engine0}
    finally:
        server.stop()


def report(runs: dict[str, list[dict[str, Any]]], console: Console) -> dict[str, Any]:
    medians = {b: {m: statistics.median(r[m] for r in rs) for m in METRICS} for b, rs in runs.items()}
    table = Table(title="frame serve at data_parallel_size N: child processes vs Ray actors (medians over rounds)")
    for column in ("backend", "out tok/s", "TTFT p50 / p99 ms", "TPOT p50 / p99 ms", "failed",
                   "CPU ms per token: API / engine", "vs mp"):
        table.add_column(column, justify="right")
    for backend, m in medians.items():
        ratio = m["output_throughput"] / medians["mp"]["output_throughput"] if "mp" in medians else float("nan")
        failed = sum(r["failed"] for r in runs[backend])
        per_token = [1e3 * m[k] / m["output_tokens"] for k in ("api_cpu_s", "engine_cpu_s")]
        table.add_row(backend, f"{m['output_throughput']:.1f}", f"{m['p50_ttft_ms']:.0f} / {m['p99_ttft_ms']:.0f}",
                      f"{m['p50_tpot_ms']:.1f} / {m['p99_tpot_ms']:.1f}", str(failed),
                      f"{per_token[0]:.1f} / {per_token[1]:.1f}", f"{ratio:.3f}x")
    console.print(table)
    return {b: {"median": medians[b], "rounds": runs[b]} for b in runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-parallel-size", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64, help="words per prompt")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--port", type=int, default=8111)
    parser.add_argument("--frame-arg", action="append", default=[], help="extra `frame serve` argument")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark run may take")
    parser.add_argument("--json", type=Path, default=None, help="write the rounds and medians here")
    args = parser.parse_args(argv)
    console = Console()
    runs: dict[str, list[dict[str, Any]]] = {"mp": [], "ray": []}
    with tempfile.TemporaryDirectory(prefix="frame-dp-") as tmp:
        for round_no in range(args.rounds):
            order = ("mp", "ray") if round_no % 2 == 0 else ("ray", "mp")
            for backend in order:
                runs[backend].append(measure(args, backend, Path(tmp)))
                console.print(f"round {round_no + 1}/{args.rounds} {backend}: "
                              f"{runs[backend][-1]['output_throughput']:.1f} output tok/s")
    result = report(runs, console)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
