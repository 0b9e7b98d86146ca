"""Start-to-healthy time of ``frame serve`` for one or more checkouts of frame, rounds alternating.

    .venv/bin/python benchmarks/serve_startup.py --checkout . --checkout /tmp/frame-before [--rounds 5]

Each checkout is a source tree of frame (its ``framework/`` and ``plugins/*/*`` go first on ``PYTHONPATH``, so
this venv's installed packages serve every checkout alike). A round starts ``frame serve`` from each checkout in
turn, with the bundled model and default flags, and times it from the process start until ``GET /health`` answers
``"ok"``; it also reads whether the API process mapped libtorch (it should not: the API side imports no torch).
The table gives each checkout's median and best time and the ratio to the first checkout's median.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.table import Table

TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pythonpath(checkout: Path) -> str:
    plugins = sorted(str(p) for p in checkout.glob("plugins/*/*") if (p / "pyproject.toml").is_file())
    return os.pathsep.join([str(checkout / "framework"), *plugins])


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
            return json.loads(resp.read()).get("status") == "ok"
    except (OSError, ValueError):
        return False


def start_once(checkout: Path) -> tuple[float, bool]:
    """Seconds from spawning ``frame serve`` to a healthy answer, and whether the API process loaded torch."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": _pythonpath(checkout)}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from frame.cli.main import main; sys.exit(main())",
                             "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while not healthy(port):
            if proc.poll() is not None or time.perf_counter() - started > TIMEOUT_S:
                raise RuntimeError(f"frame serve from {checkout} did not become healthy")
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        maps = Path(f"/proc/{proc.pid}/maps")
        torch_loaded = maps.is_file() and "libtorch" in maps.read_text()
        return elapsed, torch_loaded
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, required=True, help="a frame source tree")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    checkouts = [c.resolve() for c in args.checkout]
    times: dict[Path, list[float]] = {c: [] for c in checkouts}
    torch_in_api: dict[Path, bool] = {}
    for round_ in range(args.rounds):
        for checkout in checkouts:
            elapsed, loaded = start_once(checkout)
            times[checkout].append(elapsed)
            torch_in_api[checkout] = loaded
            print(f"round {round_ + 1}: {checkout}: {elapsed:.2f} s (API process loaded torch: {loaded})")
    table = Table(title=f"frame serve, start to healthy ({args.rounds} rounds, alternating)")
    for column in ("checkout", "median s", "best s", "vs first", "API loads torch"):
        table.add_column(column)
    first = statistics.median(times[checkouts[0]])
    for checkout in checkouts:
        median = statistics.median(times[checkout])
        table.add_row(str(checkout), f"{median:.2f}", f"{min(times[checkout]):.2f}", f"{median / first:.2f}x",
                      "yes" if torch_in_api[checkout] else "no")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
