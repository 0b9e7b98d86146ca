"""frame against itself: one workload through a dense engine and through quantized ones (or dense ones with other
platform options), rounds alternating in one process, so that every engine sees the same host over the same minutes
(issue 19's "int8 W8A8 at least 1.3x frame's own bfloat16, same run").

    .venv/bin/python benchmarks/compare_quantization.py --rounds 3                          # bfloat16 vs + int8
    .venv/bin/python benchmarks/compare_quantization.py --quantization int8 gguf --dtype float32
    .venv/bin/python benchmarks/compare_quantization.py --quantization --platform-variant huge_pages=false \
        --workload single_stream                                     # the dense engine with a platform option changed

Every engine is built and warmed up first; then each round drives the workload once through each engine in turn
(an emptied prefix cache each time), and the table gives the median output tokens/s and its ratio to the dense
engine's. Each round also records the cores that processes outside the benchmark kept busy (``bg cores``).
"""

from __future__ import annotations

import argparse
import statistics

from compare_vllm import CpuMeter, _cores
from frame.bench.driver import drive, warm_up
from frame.config import build_config, parse_key_values
from frame.engine.core.engine_core import EngineCore
from frame.workloads import load_workloads
from rich.console import Console
from rich.table import Table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mixed_batch")
    parser.add_argument("--workload-opt", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--quantization", nargs="*", default=["int8"],
                        help="quantization plugins to set beside the dense engine")
    parser.add_argument("--platform-variant", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                        help="a dense engine with these platform options, beside the default one (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    variants = {spec: parse_key_values(spec.split(","), "--platform-variant") for spec in args.platform_variant}
    names = ["dense", *args.quantization, *variants]
    engines = {name: EngineCore(build_config(dtype=args.dtype, max_model_len=args.max_model_len,
                                             quantization=name if name in args.quantization else "none",
                                             platform_options=variants.get(name)))
               for name in names}
    tokenizer = engines["dense"].source.tokenizer
    options = parse_key_values(args.workload_opt, "--workload-opt")
    requests = load_workloads().get(args.workload).generate(tokenizer, args.seed, **options)
    for engine in engines.values():
        warm_up(engine)
    rounds: dict[str, list[float]] = {name: [] for name in names}
    background: dict[str, list[float | None]] = {name: [] for name in names}
    meter = CpuMeter()
    for i in range(args.rounds):
        for name, engine in engines.items():
            engine.cache.reset()
            meter.foreign_cores()
            rounds[name].append(drive(engine, requests).summary()["output_tok_s"])
            background[name].append(meter.foreign_cores())
        console.print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in rounds.items()))

    table = Table(title=f"{args.workload}: {len(requests)} requests, {args.dtype}, output tokens/s, "
                  f"{args.rounds} rounds alternating")
    for column in ("engine", "median", "rounds", "bg cores", "vs dense"):
        table.add_column(column)
    dense = statistics.median(rounds["dense"])
    for name, values in rounds.items():
        median = statistics.median(values)
        table.add_row(name, f"{median:.1f}", " ".join(f"{v:.1f}" for v in values),
                      " ".join(_cores(b) for b in background[name]), f"{median / dense:.2f}x")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
