"""frame vs llama.cpp on the same GGUF and the same token-id prompts, rounds alternating, each paused while the
other runs; optionally both systems' perplexity on frame's shipped text.

llama.cpp is never a dependency of frame: llama-cpp-python lives in its own virtual environment (``python3 -m venv
/work/llamacpp-venv && /work/llamacpp-venv/bin/pip install llama-cpp-python``, which compiles llama.cpp for this
CPU) and runs ``benchmarks/llamacpp_driver.py`` in that interpreter, over a JSON spec file and stdin/stdout lines
(the protocol and process handling of ``compare_vllm.py``, whose helpers this script imports).

    .venv/bin/python benchmarks/compare_llamacpp.py --rounds 3                      # single stream, Q4_1 packed
    .venv/bin/python benchmarks/compare_llamacpp.py --rounds 3 --perplexity
    .venv/bin/python benchmarks/compare_llamacpp.py --quantization none --dtype float32   # frame dense
    .venv/bin/python benchmarks/compare_llamacpp.py --gguf model-Q4_K_M.gguf --rounds 3   # issue 30's four cases

``--gguf FILE`` (any GGUF) runs ``llamacpp_suite.py`` instead of one workload: single stream decode, a batch of 16
(llama.cpp decoding the sixteen together), prefill at 512 and at 4,096 prompt tokens, each case's rounds alternating.

frame runs the model with ``--quantization gguf`` by default (the GGUF's blocks kept packed, as llama.cpp keeps
them), both on the same number of threads. Each round records the cores that processes outside the benchmark kept
busy (``bg cores``) and the load average: this is a shared 2-core machine, so a round beside a busy neighbour is
not a fair number.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from compare_vllm import CpuMeter, VllmProcess, _cores, _status_kib, reset_peak_rss
from frame.bench.driver import drive, warm_up
from frame.bench.perplexity import bos_of, chunks, frame_perplexity, token_ids
from frame.config import build_config, parse_key_values
from frame.engine.core.chunking import common_prefix_length
from frame.engine.core.engine_core import EngineCore
from frame.workloads import load_workloads
from rich.console import Console
from rich.table import Table

DRIVER = Path(__file__).with_name("llamacpp_driver.py")
DEFAULT_PYTHON = "/work/llamacpp-venv/bin/python"
#: Workload sizes as the issue's llama.cpp reference numbers were measured.
ISSUE_OPTIONS: dict[str, dict[str, Any]] = {"single_stream": {"max_tokens": 256}}


class LlamaCppProcess(VllmProcess):
    """llama-cpp-python's driver in its own interpreter: ``run()`` times a round, ``perplexity()`` scores."""

    system = "llama.cpp"

    def __init__(self, python: str, spec_path: Path, show_log: bool = False) -> None:
        super().__init__(python, spec_path, {}, show_log, driver=DRIVER)

    def perplexity(self) -> dict[str, Any]:
        return self.ask("perplexity", "PERPLEXITY")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llamacpp-python", default=DEFAULT_PYTHON,
                        help="python of a virtual environment with llama-cpp-python installed")
    parser.add_argument("--model", default=None, help="a .gguf file (default: the bundled SmolLM2 Q4_1)")
    parser.add_argument("--gguf", type=Path, default=None,
                        help="any .gguf file: run issue 30's four cases on it (llamacpp_suite.py) instead of one "
                             "workload")
    parser.add_argument("--cases", nargs="*", default=[],
                        help="with --gguf, only these cases (single, batch, prefill 512, prefill 4096 ...)")
    parser.add_argument("--kv-cache-memory", default="1GiB", help="with --gguf, frame's KV pool")
    parser.add_argument("--workload", default="single_stream")
    parser.add_argument("--workload-opt", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--frame-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="a frame engine setting (e.g. num_continuous_decode_steps=8)")
    parser.add_argument("--quantization", default="gguf", help="frame's --quantization ('none': dense weights)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="frame's activation (and dense weight) dtype; auto: the platform's pick for this CPU "
                             "(bfloat16 with AVX-512 BF16 or AMX, where float32 + gguf ran a third slower)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--only", choices=["frame", "llamacpp"], default=None)
    parser.add_argument("--pause", action=argparse.BooleanOptionalAction, default=True,
                        help="stop llama.cpp's process (SIGSTOP) while frame runs; frame sleeps while it runs")
    parser.add_argument("--perplexity", action="store_true", help="also score both on frame's shipped text")
    parser.add_argument("--llamacpp-extra-buffers", action=argparse.BooleanOptionalAction, default=True,
                        help="llama.cpp's weight repacking (its AMX / repack kernels; on by default in llama.cpp)")
    parser.add_argument("--llamacpp-prefill", choices=["batch", "tokens"], default="batch",
                        help="tokens: llama.cpp reads the prompt one token at a time (its AMX buffers crash on "
                             "batches when built unpatched by GCC 12: see build_llamacpp.sh); the decode column is "
                             "unaffected")
    parser.add_argument("--n-ctx", type=int, default=512, help="perplexity chunk length")
    parser.add_argument("--show-log", action="store_true", help="echo llama.cpp's own output to stderr")
    parser.add_argument("--json", type=Path, default=None)
    return parser.parse_args(argv)


# ggml's type ids for the KV cache types frame's pool may hold (llama.cpp's type_k / type_v).
GGML_KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 30}


def main(argv: list[str] | None = None) -> int:
    import json

    args = parse_args(argv)
    if args.gguf is not None:
        from llamacpp_suite import run_suite

        return run_suite(args, LlamaCppProcess)
    console = Console()
    systems = ["frame", "llamacpp"] if args.only is None else [args.only]
    quantization = args.quantization
    config = build_config(model=args.model, dtype=args.dtype, quantization=quantization,
                          max_model_len=args.max_model_len, platform_options={"threads": args.threads},
                          **parse_key_values(args.frame_opt, "--frame-opt"))
    engine = EngineCore(config)
    if not engine.source.is_gguf:
        console.print("[red]llama.cpp reads a .gguf file; pass one to --model.[/red]")
        return 1
    tokenizer = engine.source.tokenizer
    options = {**ISSUE_OPTIONS.get(args.workload, {}), **parse_key_values(args.workload_opt, "--workload-opt")}
    requests = load_workloads().get(args.workload).generate(tokenizer, args.seed, **options)
    weights = "dense" if quantization == "none" else quantization
    label = f"frame ({str(engine.selection.dtype).removeprefix('torch.')}, {weights})"
    rounds: dict[str, list[float]] = {label: [], "llama.cpp": []}
    background: dict[str, list[float | None]] = {label: [], "llama.cpp": []}
    ttft: dict[str, list[float]] = {label: [], "llama.cpp": []}
    decode: dict[str, list[float]] = {label: [], "llama.cpp": []}  # tokens after the first, per second
    loads: list[float] = []
    outputs: dict[str, list[list[int]]] = {}
    report: dict[str, Any] = {"workload": args.workload, "workload_options": options, "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="frame-vs-llamacpp-") as tmp:
        llama = None
        if "llamacpp" in systems:
            spec = {"model": str(engine.source.path), "threads": args.threads, "n_ctx": args.max_model_len,
                    "prompts": [list(r.prompt_token_ids) for r in requests],
                    "max_tokens": [r.params.max_tokens for r in requests],
                    # Only --perplexity tokenizes the shipped text: a file whose vocabulary cannot encode it still runs.
                    "chunks": chunks(token_ids(tokenizer), args.n_ctx, bos_of(tokenizer)) if args.perplexity else [],
                    "extra_buffers": args.llamacpp_extra_buffers, "prefill": args.llamacpp_prefill,
                    # Scoring prefills whole chunks: batched, so without the buffers where prefill must go by token.
                    "score_extra_buffers": args.llamacpp_extra_buffers and args.llamacpp_prefill == "batch",
                    # llama.cpp's default float16 KV cache alone moved its perplexity 1% on a Q4_K_M file (it also
                    # rounds queries and attention weights to float16): score with frame's KV dtype.
                    "score_kv_type": GGML_KV_TYPES[engine.selection.kv_dtype]}
            (Path(tmp) / "spec.json").write_text(json.dumps(spec))
            llama = LlamaCppProcess(args.llamacpp_python, Path(tmp) / "spec.json", args.show_log)
            console.print(f"llama.cpp: {llama.version}")
        if "frame" in systems:
            reset_peak_rss()
            warm_up(engine)
        meter = CpuMeter()
        for i in range(args.rounds):
            if "frame" in systems:
                engine.cache.reset()
                if llama is not None and args.pause:
                    llama.signal(signal.SIGSTOP)
                meter.foreign_cores()
                try:
                    result = drive(engine, requests)
                finally:
                    if llama is not None:
                        llama.signal(signal.SIGCONT)
                background[label].append(meter.foreign_cores())
                summary = result.summary()
                rounds[label].append(summary["output_tok_s"])
                decode[label].append(1000.0 / summary["tpot_ms"])
                if len(requests) == 1 and result.timings[0].ttft is not None:
                    ttft[label].append(result.timings[0].ttft)
                outputs["frame"] = [t.output_token_ids for t in result.timings]
            if llama is not None:
                meter.foreign_cores()
                theirs = llama.run()
                background["llama.cpp"].append(meter.foreign_cores())
                rounds["llama.cpp"].append(theirs["output_tokens"] / theirs["elapsed_s"])
                decode["llama.cpp"].append((theirs["output_tokens"] - len(requests))
                                           / (theirs["elapsed_s"] - theirs["first_token_s"]))
                if theirs.get("ttft_s") is not None:
                    ttft["llama.cpp"].append(theirs["ttft_s"])
                outputs["llama.cpp"] = theirs["outputs"]
            loads.append(os.getloadavg()[0])
            console.print(f"round {i + 1}: " + ", ".join(
                f"{k} {v[-1]:.1f} tok/s (bg {_cores(background[k][-1])} cores)" for k, v in rounds.items() if v)
                + f"; load {loads[-1]:.2f}")
        scores: dict[str, dict[str, Any]] = {}
        if args.perplexity:
            if "frame" in systems:
                scores[label] = frame_perplexity(config, label, args.n_ctx).as_json()
            if llama is not None:
                scores["llama.cpp"] = llama.perplexity()
        if llama is not None:
            llama.close()

    table = Table(title=f"{args.workload}: {len(requests)} requests, {args.threads} threads, output tokens/s "
                  f"(load average {', '.join(f'{x:.2f}' for x in loads)})")
    for column in ("system", "median", "rounds", "decode tok/s", "bg cores", "TTFT ms", "perplexity"):
        table.add_column(column)
    for name, values in rounds.items():
        if values or name in scores:
            table.add_row(name, f"{statistics.median(values):.1f}" if values else "-",
                          " ".join(f"{v:.1f}" for v in values),
                          f"{statistics.median(decode[name]):.1f}" if decode[name] else "-",
                          " ".join(_cores(b) for b in background[name]),
                          f"{statistics.median(ttft[name]) * 1000:.0f}" if ttft[name] else "-",
                          f"{scores[name]['perplexity']:.4f}" if name in scores else "-")
    console.print(table)
    report.update(rounds=rounds, decode_tok_s=decode, background_cores=background, ttft_s=ttft, load_average=loads,
                  perplexity=scores,
                  frame_peak_rss_mib=_status_kib(os.getpid(), "VmHWM") / 1024)
    if rounds[label] and rounds["llama.cpp"]:
        ratio = statistics.median(rounds[label]) / statistics.median(rounds["llama.cpp"])
        shared = [common_prefix_length(list(a), list(b), len(a))
                  for a, b in zip(outputs["frame"], outputs["llama.cpp"], strict=True)]
        decode_ratio = statistics.median(decode[label]) / statistics.median(decode["llama.cpp"])
        console.print(f"frame / llama.cpp: {ratio:.2f}x tokens/s, {decode_ratio:.2f}x decode tokens/s; greedy outputs "
                      f"share their first {', '.join(map(str, shared))} tokens")
        report.update(ratio=ratio, decode_ratio=decode_ratio, shared_prefix_tokens=shared, outputs=outputs,
                      llamacpp_extra_buffers=args.llamacpp_extra_buffers, llamacpp_prefill=args.llamacpp_prefill)
    if len(scores) == 2:
        ppl = scores[label]["perplexity"] / scores["llama.cpp"]["perplexity"]
        console.print(f"perplexity frame / llama.cpp: {ppl:.4f} ({(ppl - 1) * 100:+.2f}%)")
        report["perplexity_ratio"] = ppl
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
