"""``compare_llamacpp.py --gguf FILE``: issue 30's four measurements of one GGUF file, frame against llama.cpp, in
one run with rounds alternating (llama.cpp paused while frame runs):

- single stream: one 32-token prompt, 128 greedy tokens; decode tokens/s after the first token;
- batch of 16: sixteen 32-token prompts, 64 tokens each, all at once (frame's continuous batching; llama.cpp
  decoding the sixteen sequences together, a token of each per ``llama_decode``); output tokens/s;
- prefill 512 and prefill 4,096: one prompt of that many tokens and one new token; prompt tokens/s to it.

Prompts are random token ids inside the file's chat template (the workloads of ``frame bench``). Each round notes
the cores that processes outside the benchmark kept busy: on a shared machine, read the ratios with them.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compare_vllm import CpuMeter, _cores
from frame.bench.driver import drive, warm_up
from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.workloads import load_workloads
from rich.console import Console
from rich.table import Table


@dataclass
class Case:
    """One measurement: a workload, how its speed is read, and whether llama.cpp decodes its prompts together."""

    name: str
    workload: str
    options: dict[str, Any]
    metric: str  # "decode", "output" or "prefill"
    batched: bool = False
    frame: list[float] = field(default_factory=list)
    llamacpp: list[float] = field(default_factory=list)
    background: list[str] = field(default_factory=list)


def cases() -> list[Case]:
    return [Case("single stream decode", "single_stream", {"prompt_len": 32, "max_tokens": 128}, "decode"),
            Case("batch of 16", "mixed_batch", {"num_requests": 16, "prompt_len": 32, "max_tokens": 64}, "output",
                 batched=True),
            Case("prefill 512", "single_stream", {"prompt_len": 512, "max_tokens": 1}, "prefill"),
            Case("prefill 4096", "single_stream", {"prompt_len": 4096, "max_tokens": 1}, "prefill")]


def frame_speed(case: Case, result: Any, prompt_len: int) -> float:
    summary = result.summary()
    if case.metric == "decode":
        return 1000.0 / summary["tpot_ms"]
    if case.metric == "output":
        return summary["output_tok_s"]
    return prompt_len / result.timings[0].ttft


def llamacpp_speed(case: Case, result: dict[str, Any], requests: int, prompt_len: int) -> float:
    if case.metric == "decode":
        return (result["output_tokens"] - requests) / (result["elapsed_s"] - result["first_token_s"])
    if case.metric == "output":
        return result["output_tokens"] / result["elapsed_s"]
    return prompt_len / result["ttft_s"]


def run_suite(args: Any, process: type) -> int:
    """Every case on ``args.gguf``, ``args.rounds`` rounds each; ``process`` is compare_llamacpp's LlamaCppProcess."""
    console = Console()
    max_model_len = 4096 + 512
    config = build_config(model=str(args.gguf), dtype=args.dtype, quantization=args.quantization,
                          max_model_len=max_model_len, kv_cache_memory=args.kv_cache_memory,
                          platform_options={"threads": args.threads})
    engine = EngineCore(config)
    warm_up(engine)
    meter = CpuMeter()
    all_cases = [c for c in cases() if not args.cases or c.name.split()[0] in args.cases or c.name in args.cases]
    for case in all_cases:
        requests = load_workloads().get(case.workload).generate(engine.source.tokenizer, args.seed, **case.options)
        prompt_len = len(requests[0].prompt_token_ids)
        spec = {"model": str(args.gguf), "threads": args.threads, "n_ctx": max_model_len, "batched": case.batched,
                "prompts": [list(r.prompt_token_ids) for r in requests],
                "max_tokens": [r.params.max_tokens for r in requests], "chunks": [],
                "extra_buffers": args.llamacpp_extra_buffers, "prefill": args.llamacpp_prefill}
        with tempfile.TemporaryDirectory(prefix="frame-vs-llamacpp-") as tmp:
            (Path(tmp) / "spec.json").write_text(json.dumps(spec))
            llama = process(args.llamacpp_python, Path(tmp) / "spec.json", args.show_log)
            try:
                for i in range(args.rounds):
                    engine.cache.reset()
                    llama.signal(signal.SIGSTOP)
                    meter.foreign_cores()
                    try:
                        result = drive(engine, requests)
                    finally:
                        llama.signal(signal.SIGCONT)
                    ours = meter.foreign_cores()
                    case.frame.append(frame_speed(case, result, prompt_len))
                    theirs = llama.run()
                    case.llamacpp.append(llamacpp_speed(case, theirs, len(requests), prompt_len))
                    case.background.append(f"{_cores(ours)}/{_cores(meter.foreign_cores())}")
                    console.print(f"{case.name} round {i + 1}: frame {case.frame[-1]:.1f}, llama.cpp "
                                  f"{case.llamacpp[-1]:.1f} tok/s (bg cores {case.background[-1]}; load "
                                  f"{os.getloadavg()[0]:.2f})")
            finally:
                llama.close()
    table = Table(title=f"{Path(args.gguf).name}: frame ({args.quantization}) vs llama.cpp {llama.version}, "
                  f"{args.threads} threads, tokens/s, median of {args.rounds} alternating rounds")
    for column in ("case", "frame", "llama.cpp", "frame / llama.cpp", "frame rounds", "llama.cpp rounds",
                   "bg cores (frame/llama.cpp)"):
        table.add_column(column)
    report = []
    for case in all_cases:
        ours, theirs = statistics.median(case.frame), statistics.median(case.llamacpp)
        table.add_row(case.name, f"{ours:.1f}", f"{theirs:.1f}", f"{ours / theirs:.2f}x",
                      " ".join(f"{v:.1f}" for v in case.frame), " ".join(f"{v:.1f}" for v in case.llamacpp),
                      " ".join(case.background))
        report.append({"case": case.name, "frame": case.frame, "llamacpp": case.llamacpp, "ratio": ours / theirs,
                       "background_cores": case.background})
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"gguf": str(args.gguf), "threads": args.threads, "cases": report}, indent=2))
    return 0
