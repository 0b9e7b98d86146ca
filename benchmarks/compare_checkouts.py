"""One benchmark, two or more checkouts of frame, rounds alternating: did a change make frame slower?

    .venv/bin/python benchmarks/compare_checkouts.py --checkout /tmp/frame-before --checkout . --rounds 3 \\
        -- benchmarks/compare_vllm.py --only frame --workload mixed_batch --rounds 1

Each checkout is a source tree of frame: its ``framework/`` and ``plugins/*/*`` go first on ``PYTHONPATH`` (this
venv's packages serve all checkouts alike) and the benchmark script is run from that checkout. Every round runs the
benchmark once per checkout, in turn, with ``--json FILE`` appended; the value compared is the median of the
report's ``rounds.frame`` (tokens/s for ``compare_vllm.py``). Refactors that promise "no slower" quote this
table: each checkout's median over rounds and its ratio to the first checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _pythonpath(checkout: Path) -> str:
    plugins = sorted(str(p) for p in checkout.glob("plugins/*/*") if (p / "pyproject.toml").is_file())
    return os.pathsep.join([str(checkout / "framework"), *plugins])


def run_once(checkout: Path, script: str, args: list[str]) -> float:
    """The median ``rounds.frame`` of one run of ``script`` from ``checkout``."""
    with tempfile.TemporaryDirectory(prefix="frame-checkouts-") as tmp:
        report = Path(tmp) / "report.json"
        env = {**os.environ, "PYTHONPATH": _pythonpath(checkout)}
        subprocess.run([sys.executable, str(checkout / script), *args, "--json", str(report)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        return statistics.median(json.loads(report.read_text())["rounds"]["frame"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, required=True, help="a frame source tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("benchmark", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...], relative to a checkout")
    args = parser.parse_args(argv)
    command = args.benchmark[1:] if args.benchmark[:1] == ["--"] else args.benchmark
    if not command:
        parser.error("give the benchmark after --, e.g. -- benchmarks/compare_vllm.py --only frame")
    checkouts = [c.resolve() for c in args.checkout]
    values: dict[Path, list[float]] = {c: [] for c in checkouts}
    for round_ in range(args.rounds):
        for checkout in checkouts:
            value = run_once(checkout, command[0], command[1:])
            values[checkout].append(value)
            print(f"round {round_ + 1}: {checkout}: {value:.1f}", flush=True)
    table = Table(title=f"{' '.join(command)} ({args.rounds} rounds, alternating)")
    for column in ("checkout", "median", "rounds", "vs first"):
        table.add_column(column)
    first = statistics.median(values[checkouts[0]])
    for checkout in checkouts:
        median = statistics.median(values[checkout])
        table.add_row(str(checkout), f"{median:.1f}", " ".join(f"{v:.1f}" for v in values[checkout]),
                      f"{median / first:.3f}x")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
