"""``frame bench throughput|latency``: frame and transformers on the same prompts, side by side in one run.

Each system runs in its own child process (:mod:`frame.bench.worker`) so peak RSS is measured per system and
neither warms the other's caches. frame runs first; transformers then uses the dtype frame resolved.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from frame.bench.worker import encode_requests
from frame.config import EngineConfig
from frame.errors import FrameUsageError
from frame.interfaces.workload import WorkloadRequest
from frame.model_source import ModelSource
from frame.workloads import load_workloads

#: (metric key, column title, format, higher is better)
COLUMNS = [
    ("output_tok_s", "output tok/s", "{:.1f}", True),
    ("total_tok_s", "total tok/s", "{:.1f}", True),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}", False),
    ("tpot_ms", "TPOT ms", "{:.1f}", False),
    ("elapsed_s", "wall s", "{:.2f}", False),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}", False),
]


@dataclass
class Comparison:
    """The results of one side-by-side run."""

    workload: str
    params: dict[str, Any]
    requests: int
    systems: dict[str, dict[str, Any]]

    def ratio(self, key: str) -> float:
        ours, theirs = (self.systems.get(s, {}).get("summary", {}).get(key) for s in ("frame", "transformers"))
        return ours / theirs if ours and theirs and not math.isnan(theirs) else math.nan

    def greedy_match(self) -> float:
        """Share of requests whose output tokens are identical in both systems (NaN without a baseline)."""
        if "transformers" not in self.systems:
            return math.nan
        pairs = zip(self.systems["frame"]["outputs"], self.systems["transformers"]["outputs"], strict=True)
        same = [a == b for a, b in pairs]
        return sum(same) / len(same)

    def as_json(self) -> dict[str, Any]:
        systems = {name: {k: v for k, v in s.items() if k != "outputs"} for name, s in self.systems.items()}
        ratios = {key: self.ratio(key) for key, *_ in COLUMNS if key != "peak_rss_mib"}
        return {"workload": self.workload, "params": self.params, "requests": self.requests, "systems": systems,
                "ratio_frame_over_transformers": ratios, "greedy_match": self.greedy_match()}


def make_requests(workload: str, params: dict[str, Any], seed: int, config: EngineConfig) -> list[WorkloadRequest]:
    tokenizer = ModelSource.open(config.model, config.tokenizer, config.trust_remote_code).tokenizer
    return load_workloads().get(workload).generate(tokenizer, seed, **params)


def _run_worker(spec: dict[str, Any], console: Console) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="frame-bench-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_bytes(msgspec.json.encode(spec))
        # TQDM_DISABLE: transformers' GGUF conversion bar would interleave with the worker's own progress bar.
        proc = subprocess.run([sys.executable, "-m", "frame.bench.worker", str(spec_path), str(result_path)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
        if proc.returncode != 0 or not result_path.is_file():
            raise FrameUsageError(f"The {spec['system']} benchmark process failed (exit {proc.returncode}); "
                                  "its error is printed above.")
        return json.loads(result_path.read_text())


def compare(workload: str, params: dict[str, Any], config: EngineConfig, *, seed: int, repeat: int,
            baseline: bool, batch_size: int | None, console: Console) -> Comparison:
    requests = make_requests(workload, params, seed, config)
    common = {"engine": config.model_dump(mode="json"), "requests": encode_requests(requests), "repeat": repeat}
    systems = {"frame": _run_worker({**common, "system": "frame"}, console)}
    if baseline:
        spec = {**common, "system": "transformers", "dtype": systems["frame"]["dtype"],
                "batch_size": batch_size or min(len(requests), config.max_num_seqs)}
        systems["transformers"] = _run_worker(spec, console)
    for result in systems.values():
        result["summary"]["peak_rss_mib"] = result["peak_rss_mib"]
    return Comparison(workload, params, len(requests), systems)


def render(comparison: Comparison, console: Console) -> None:
    """Print the side-by-side table, with frame/transformers ratios when both ran."""
    systems = comparison.systems
    ranks = systems["frame"].get("tensor_parallel_size", 1)
    weights = systems["frame"].get("weights", "dense")
    table = Table(title=f"{comparison.workload}: {comparison.requests} requests, "
                        f"dtype {systems['frame']['dtype']}" + (f", frame on {ranks} tensor-parallel ranks"
                                                               if ranks > 1 else "")
                        + (f", frame's weights {weights} (transformers' dense)" if weights != "dense" else ""))
    table.add_column("system", no_wrap=True)
    for _key, title, _fmt, _ in COLUMNS:
        table.add_column(title, justify="right")
    for name, result in systems.items():
        table.add_row(name, *(fmt.format(result["summary"].get(key, math.nan)) for key, _t, fmt, _ in COLUMNS))
    if "transformers" in systems:
        table.add_row("[bold]ratio frame/hf", *(f"{comparison.ratio(key):.2f}x" for key, *_ in COLUMNS))
    console.print(table)
    frame = systems["frame"]["summary"]
    if ranks > 1:
        console.print(f"tensor parallelism: {ranks} ranks; communication {frame['comm_ms_per_step']:.2f} ms per step "
                      f"({frame['comm_share']:.0%} of frame's wall time, driver rank)")
    if "transformers" in systems:
        match = comparison.greedy_match()
        why = ""
        if match < 1 and weights != "dense":
            # Packed GGUF blocks round each linear's input to int8 per block (as llama.cpp does), which transformers'
            # dequantized weights do not: greedy paths part at the first token that rounding tips.
            why = (f" (frame ran the weights {weights}, whose kernels round activations to int8 per block; "
                   "--quantization none runs the dense weights transformers runs)")
        elif match < 1 and systems["frame"]["dtype"] != "float32":
            # Not a bug: batched bfloat16 sums round in another order than transformers' do, and a greedy path
            # parts at the first near-tie; the tests compare float32 token for token and bfloat16 by near-tie.
            why = (f" ({systems['frame']['dtype']} sums round in another order than transformers' do, so greedy "
                   "paths part at near-ties; --dtype float32 compares token for token)")
        console.print(f"greedy outputs identical for {match:.0%} of requests{why}")
    else:
        console.print("transformers baseline skipped (--no-baseline)")
