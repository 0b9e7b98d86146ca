"""Served output tokens/s of one ``frame serve`` under ``frame bench serve`` load, in the shape compare_checkouts reads.

    .venv/bin/python benchmarks/compare_checkouts.py --checkout /tmp/frame-before --checkout . --rounds 3 \\
        -- benchmarks/serve_load.py --concurrency 8 --rounds 1

It starts ``frame serve`` (bundled model, ``--dtype``, prefix cache reset between runs) from whatever frame is on
``PYTHONPATH`` (compare_checkouts puts each checkout's there), waits until ``/health`` is "ok", warms it with a few
requests, then runs frame's own load generator (:mod:`frame.bench.serve`: random token prompts of ``--input-len``,
``--output-len`` tokens each with ``ignore_eos``, ``--concurrency`` in flight) ``--rounds`` times. ``--json`` gets
``{"rounds": {"frame": [output tokens/s per round]}, "runs": [the generator's summaries]}``. No vLLM needed: this
is how a refactor shows the server is no slower, next to compare_serve.py's comparison with ``vllm serve``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from serve_startup import TIMEOUT_S, free_port, healthy  # this folder is on sys.path: run as a script


def _load(port: int, args: argparse.Namespace, num_prompts: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="frame-serve-load-") as tmp:
        report = Path(tmp) / "summary.json"
        subprocess.run([sys.executable, "-m", "frame.bench.serve", "--base-url", f"http://127.0.0.1:{port}",
                        "--dataset", "random", "--input-len", str(args.input_len), "--output-len",
                        str(args.output_len), "--num-prompts", str(num_prompts), "--concurrency",
                        str(args.concurrency), "--seed", str(seed), "--json", str(report)],
                       check=True, stdout=subprocess.DEVNULL)
        return json.loads(report.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--num-prompts", type=int, default=32, help="requests per round")
    parser.add_argument("--input-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "frame.cli.main", "serve", "--port", str(port), "--dtype",
                             args.dtype, "--enable-reset-prefix-cache"], env=os.environ,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not healthy(port):
            if proc.poll() is not None or time.perf_counter() - started > TIMEOUT_S:
                raise RuntimeError("frame serve did not become healthy")
            time.sleep(0.1)
        _load(port, args, num_prompts=args.concurrency, seed=1_000)  # warm-up: first steps, thread pools
        runs = []
        for round_ in range(args.rounds):
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/reset_prefix_cache",
                                                          method="POST"), timeout=30).close()
            runs.append(_load(port, args, num_prompts=args.num_prompts, seed=round_))
            print(f"round {round_ + 1}: {runs[-1]['output_throughput']:.1f} output tok/s")
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": {"frame": [r["output_throughput"] for r in runs]}, "runs": runs},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
