"""Time to first token of one long prompt: frame against vLLM-CPU (same weights and dtype) and llama.cpp (the same
GGUF), in one run, rounds alternating, each system paused while another one runs.

    .venv/bin/python benchmarks/compare_ttft.py --vllm-python /work/vllm-venv/bin/python \\
        --llamacpp-python /work/llama-venv/bin/python --rounds 3

The prompt is frame's ``single_stream`` workload with ``prompt_len=--prompt-tokens`` (random tokens inside the chat
template, 8,000 by default) and ``max_tokens=1``, so a round's time is the time to first token of a cold prefill.
It drives the two other systems through ``compare_vllm.py``'s and ``compare_llamacpp.py``'s drivers and helpers:
vLLM gets the weights transformers dequantises from the GGUF (exported once), ``VLLM_ENV`` and vLLM's own chunked
prefill; llama.cpp reads the GGUF itself (its packed blocks; frame and vLLM run them dense in ``--dtype``), with its
weight-repacking buffers off unless ``--llamacpp-extra-buffers`` (they crash on batched prompts on AMX Xeons).
Every system warms up first (frame and vLLM on the whole prompt, llama.cpp, whose every prefill takes tens of seconds
and compiles nothing, on its first ``--warmup-tokens``), and every
round starts with an empty prefix cache (frame's ``cache.reset()``, vLLM's ``reset_prefix_cache()``, llama.cpp's
``reset()``). Each round records the cores that processes outside the benchmark kept busy (``bg cores``) and the
load average: on a shared machine only the ratios mean anything. A system that cannot start (no ``--vllm-python``,
no llama-cpp-python) is left out and the report says why.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from compare_llamacpp import DEFAULT_PYTHON, LlamaCppProcess
from compare_vllm import VLLM_ENV, CpuMeter, VllmProcess, _cores, export_hf_folder, vllm_missing, vllm_preload
from frame.bench.driver import drive, warm_up
from frame.config import build_config, parse_key_values
from frame.engine.core.engine_core import EngineCore
from frame.workloads import load_workloads
from rich.console import Console
from rich.table import Table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=None, help="python of a virtual environment with vLLM installed")
    parser.add_argument("--llamacpp-python", default=DEFAULT_PYTHON,
                        help="python of a virtual environment with llama-cpp-python installed")
    parser.add_argument("--skip", action="append", default=[], choices=["vllm", "llamacpp"],
                        help="leave a system out")
    parser.add_argument("--prompt-tokens", type=int, default=8000, help="the prompt's length, chat template included")
    parser.add_argument("--rounds", type=int, default=3, help="timed prefills per system, alternating")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                        help="frame's and vLLM's dtype (llama.cpp runs the GGUF's own blocks)")
    parser.add_argument("--quantization", default="none",
                        help="frame's --quantization: none (default) runs the dense weights vLLM runs; gguf keeps the "
                             "file's blocks packed, as llama.cpp does")
    parser.add_argument("--max-model-len", type=int, default=8192,
                        help="every system's context (SmolLM2's is 8,192; vLLM refuses more than the model's)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="llama.cpp's threads (on a loaded host its spinning barriers may run faster on fewer)")
    parser.add_argument("--warmup-tokens", type=int, default=1024,
                        help="llama.cpp warms up on the prompt's first this many tokens (it compiles nothing per "
                             "shape, and its whole prefill takes tens of seconds); frame and vLLM on the whole prompt, "
                             "so the first timed round finds the KV pool and buffers touched, as a server's would be")
    parser.add_argument("--llamacpp-extra-buffers", action=argparse.BooleanOptionalAction, default=False,
                        help="llama.cpp's weight repacking (AMX / repack kernels); off by default because on a Xeon "
                             "with AMX its buffers crash on batched prompts unless built by build_llamacpp.sh")
    parser.add_argument("--llamacpp-prefill", choices=["batch", "tokens"], default="batch",
                        help="tokens: llama.cpp reads the prompt one token at a time (what its AMX buffers survive)")
    parser.add_argument("--vllm-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment for vLLM's process, over VLLM_ENV (KEY= drops a default)")
    parser.add_argument("--vllm-engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="extra LLM(...) keyword argument, value as JSON (default: vLLM's own chunked prefill)")
    parser.add_argument("--show-log", action="store_true", help="echo vLLM's and llama.cpp's own output to stderr")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


def start_vllm(args: argparse.Namespace, engine: EngineCore, prompt: list[int], tmp: Path,
               console: Console) -> VllmProcess:
    """vLLM's driver on the dequantised export of frame's checkpoint, warmed up on the prompt."""
    preload = vllm_preload(args.vllm_python)
    overrides = {k: str(v) for k, v in parse_key_values(args.vllm_env, "--vllm-env").items()}
    env = {**VLLM_ENV, **({"LD_PRELOAD": preload} if preload else {}), **overrides}
    env = {k: v for k, v in env.items() if v not in ("", "None")}
    engine_args = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.vllm_engine_arg)}
    folder = export_hf_folder(engine.source, args.dtype)
    spec = {"model": str(folder), "tokenizer": str(folder), "dtype": args.dtype, "max_model_len": args.max_model_len,
            "prompts": [prompt], "max_tokens": [1], "engine_args": engine_args, "warmup_rounds": 1}
    (tmp / "vllm.json").write_text(json.dumps(spec))
    console.print(f"vLLM env: {' '.join(f'{k}={v}' for k, v in env.items())}"
                  + (f"; engine args: {engine_args}" if engine_args else ""))
    return VllmProcess(args.vllm_python, tmp / "vllm.json", env, args.show_log)


def start_llamacpp(args: argparse.Namespace, engine: EngineCore, prompt: list[int], tmp: Path) -> LlamaCppProcess:
    """llama.cpp's driver on frame's GGUF, warmed up on the prompt's first ``--warmup-tokens``."""
    spec = {"model": str(engine.source.path), "threads": args.threads, "n_ctx": args.max_model_len,
            "prompts": [prompt], "max_tokens": [1], "chunks": [], "warmup_prompt": prompt[:args.warmup_tokens],
            "extra_buffers": args.llamacpp_extra_buffers, "prefill": args.llamacpp_prefill}
    (tmp / "llamacpp.json").write_text(json.dumps(spec))
    return LlamaCppProcess(args.llamacpp_python, tmp / "llamacpp.json", args.show_log)


def why_not_llamacpp(args: argparse.Namespace, engine: EngineCore) -> str | None:
    """Why llama.cpp cannot run (None when it can)."""
    if "llamacpp" in args.skip:
        return "--skip llamacpp"
    if not engine.source.is_gguf:
        return "frame's model is not a .gguf file"
    if not Path(args.llamacpp_python).exists():
        return f"{args.llamacpp_python} does not exist"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    engine = EngineCore(build_config(dtype=args.dtype, quantization=args.quantization,
                                      max_model_len=args.max_model_len))
    requests = load_workloads().get("single_stream").generate(
        engine.source.tokenizer, args.seed, prompt_len=args.prompt_tokens, max_tokens=1)
    prompt = list(requests[0].prompt_token_ids)
    skipped = {"vLLM": "--skip vllm" if "vllm" in args.skip else vllm_missing(args.vllm_python),
               "llama.cpp": why_not_llamacpp(args, engine)}
    others: dict[str, VllmProcess] = {}
    buffers = "on" if args.llamacpp_extra_buffers else "off"
    weights = "dense" if args.quantization == "none" else args.quantization
    labels = {"frame": f"frame ({args.dtype}, {weights})", "vLLM": f"vLLM ({args.dtype})",
              "llama.cpp": f"llama.cpp (GGUF, buffers {buffers}, prefill by {args.llamacpp_prefill})"}
    with tempfile.TemporaryDirectory(prefix="frame-ttft-") as tmp:
        try:
            if skipped["vLLM"] is None:
                others["vLLM"] = start_vllm(args, engine, prompt, Path(tmp), console)
            if skipped["llama.cpp"] is None:
                others["llama.cpp"] = start_llamacpp(args, engine, prompt, Path(tmp))
                console.print(f"llama.cpp: {others['llama.cpp'].version}")
            for name, why in skipped.items():
                if why is not None:
                    console.print(f"[yellow]{name} left out:[/yellow] {why}")
            warm_up(engine)
            drive(engine, requests)

            def frame_round() -> dict[str, Any]:
                engine.cache.reset()
                timing = drive(engine, requests).timings[0]
                return {"ttft_s": timing.ttft, "outputs": [timing.output_token_ids]}

            runners: dict[str, Callable[[], dict[str, Any]]] = {"frame": frame_round}
            runners.update({name: process.run for name, process in others.items()})
            ttft, background, first = rounds(runners, others, args.rounds, console)
        finally:
            for process in others.values():
                process.signal(signal.SIGCONT)
                process.close()
    report_results(args, labels, ttft, background, first, skipped, console)
    return 0


def rounds(runners: dict[str, Callable[[], dict[str, Any]]], others: dict[str, VllmProcess], count: int,
           console: Console) -> tuple[dict[str, list[float]], dict[str, list[float | None]], dict[str, int]]:
    """``count`` rounds, each running every system once in turn while the others' processes are stopped."""
    ttft: dict[str, list[float]] = {name: [] for name in runners}
    background: dict[str, list[float | None]] = {name: [] for name in runners}
    first: dict[str, int] = {}
    meter = CpuMeter()
    for i in range(count):
        for name, run in runners.items():
            paused = [p for other, p in others.items() if other != name]
            for process in paused:
                process.signal(signal.SIGSTOP)
            meter.foreign_cores()
            try:
                result = run()
            finally:
                for process in paused:
                    process.signal(signal.SIGCONT)
            background[name].append(meter.foreign_cores())
            ttft[name].append(result["ttft_s"])
            first[name] = result["outputs"][0][0]
        console.print(f"round {i + 1}: " + ", ".join(
            f"{name} {values[-1]:.2f} s (bg {_cores(background[name][-1])} cores)" for name, values in ttft.items())
            + f"; load {os.getloadavg()[0]:.2f}")
    return ttft, background, first


def report_results(args: argparse.Namespace, labels: dict[str, str], ttft: dict[str, list[float]],
                   background: dict[str, list[float | None]], first: dict[str, int],
                   skipped: dict[str, str | None], console: Console) -> None:
    """The table (median TTFT per system and how many times frame's it is), and the JSON report."""
    frame = statistics.median(ttft["frame"])
    table = Table(title=f"time to first token, one {args.prompt_tokens}-token prompt, cold cache "
                  f"(load average now {os.getloadavg()[0]:.2f})")
    for column in ("system", "median s", "rounds s", "bg cores", "its TTFT / frame's", "first token"):
        table.add_column(column)
    ratios = {}
    for name, values in ttft.items():
        ratios[name] = statistics.median(values) / frame
        table.add_row(labels[name], f"{statistics.median(values):.2f}", " ".join(f"{v:.2f}" for v in values),
                      " ".join(_cores(b) for b in background[name]), f"{ratios[name]:.2f}x", str(first[name]))
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({
            "prompt_tokens": args.prompt_tokens, "dtype": args.dtype, "ttft_s": ttft, "background_cores": background,
            "ratio_to_frame": ratios, "first_token": first, "skipped": skipped}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
