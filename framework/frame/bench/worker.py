"""One system's side of ``frame bench throughput|latency``, run in its own process so its peak RSS is its own.

``python -m frame.bench.worker SPEC.json RESULT.json``: SPEC names the system (``frame`` or ``transformers``),
the engine config, the requests (token ids and sampling params) and the number of timed repeats; RESULT gets
the median run's summary, every repeat's summary, the output token ids and the process's peak RSS. JSON both
ways (no pickle). Progress goes to stderr.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from frame.bench.metrics import peak_rss_mib, summarize
from frame.interfaces.workload import WorkloadRequest, greedy
from frame.sampling_params import SamplingParams


def encode_requests(requests: list[WorkloadRequest]) -> list[dict[str, Any]]:
    return [{"prompt_token_ids": list(r.prompt_token_ids), "params": msgspec.to_builtins(r.params),
             "wave": r.wave, "priority": r.priority, "cache_salt": r.cache_salt} for r in requests]


def decode_requests(items: list[dict[str, Any]]) -> list[WorkloadRequest]:
    return [WorkloadRequest(tuple(i["prompt_token_ids"]), msgspec.convert(i["params"], SamplingParams),
                            i["wave"], i["priority"], i["cache_salt"]) for i in items]


@contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A transient progress bar on stderr; yields the function that advances it by ``n`` tokens."""
    progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    task = progress.add_task(label, total=total)
    with progress:
        yield lambda n: progress.advance(task, n)


def _run_frame(spec: dict[str, Any], requests: list[WorkloadRequest]) -> tuple[list[dict], list[list[int]], str, str]:
    from frame.bench.driver import drive, warm_up
    from frame.config import build_config
    from frame.engine.core.engine_core import EngineCore
    from frame.engine.selection import select_quantization

    load = time.perf_counter()
    engine = EngineCore(build_config(spec["engine"]))
    load = time.perf_counter() - load
    warm_up(engine)
    runs, outputs = [], []
    total = sum(r.params.max_tokens or 0 for r in requests)
    for repeat in range(spec["repeat"]):
        engine.reset_prefix_cache()  # every repeat starts from a cold prefix cache, as the first did
        with _progress(f"frame run {repeat + 1}/{spec['repeat']}", total) as advance:
            result = drive(engine, requests, advance)
        runs.append({**result.summary(), "load_s": load})
        outputs = [t.output_token_ids for t in result.timings]
    method = select_quantization(engine.hooks, engine.config, engine.source, engine.selection.platform)
    weights = method.name if method is not None else "dense"
    engine.shutdown()
    return runs, outputs, str(engine.selection.dtype).removeprefix("torch."), weights


def _run_transformers(spec: dict[str, Any], requests: list[WorkloadRequest]
                      ) -> tuple[list[dict], list[list[int]], str, str]:
    import torch

    from frame.bench.baseline import TransformersBaseline
    from frame.model_source import ModelSource

    load = time.perf_counter()
    source = ModelSource.open(spec["engine"].get("model"), spec["engine"].get("tokenizer"))
    baseline = TransformersBaseline(source, getattr(torch, spec["dtype"]))
    load = time.perf_counter() - load
    baseline.run([WorkloadRequest(tuple(range(100, 108)), greedy(2))], 1)  # warm-up, as frame gets one
    runs, outputs = [], []
    total = sum(r.params.max_tokens or 0 for r in requests)
    for repeat in range(spec["repeat"]):
        with _progress(f"transformers run {repeat + 1}/{spec['repeat']}", total) as advance:
            timings, elapsed = baseline.run(requests, spec["batch_size"], advance)
        runs.append({**summarize(timings, elapsed), "load_s": load})
        outputs = [t.output_token_ids for t in timings]
    return runs, outputs, spec["dtype"], "dense"


def main(argv: list[str]) -> int:
    spec_path, result_path = Path(argv[0]), Path(argv[1])
    spec = msgspec.json.decode(spec_path.read_bytes())
    requests = decode_requests(spec["requests"])
    runner = _run_frame if spec["system"] == "frame" else _run_transformers
    runs, outputs, dtype, weights = runner(spec, requests)
    median = sorted(runs, key=lambda r: r["output_tok_s"])[len(runs) // 2]
    result = {"system": spec["system"], "dtype": dtype, "weights": weights, "summary": median, "runs": runs,
              "outputs": outputs,
              "peak_rss_mib": peak_rss_mib(),
              "tensor_parallel_size": spec["engine"].get("tensor_parallel_size", 1) if spec["system"] == "frame" else 1}
    result_path.write_bytes(msgspec.json.encode(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
