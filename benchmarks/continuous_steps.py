"""One decode step a scheduler pass against several, in one process, rounds alternating, the host probed before each.

    .venv/bin/python benchmarks/continuous_steps.py [--steps 1 8] [--rounds 6] [--dtype bfloat16]
        [--quantization none]

``num_continuous_decode_steps`` lets the engine run N decode steps without going back through its Python (the
scheduler, the output processing) between them. Whether that pays depends on how much of a token the Python is,
and on a VM that moves with where the host puts the two CPUs (``host_probe.py``): so each engine's single stream
runs in turn after the same probe, and the rounds print the host's state beside each time per output token.
"""

from __future__ import annotations

import argparse
import statistics

from frame.bench.driver import drive, warm_up
from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.workloads import load_workloads
from host_probe import HostProbe
from rich.console import Console
from rich.table import Table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 8], help="num_continuous_decode_steps to compare")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="none", help="none: the dense weights; gguf: the file's, packed")
    parser.add_argument("--workload", default="single_stream")
    args = parser.parse_args()
    console = Console()
    engines = {n: EngineCore(build_config(None, dtype=args.dtype, quantization=args.quantization,
                                          num_continuous_decode_steps=n)) for n in args.steps}
    first = next(iter(engines.values()))
    requests = load_workloads().get(args.workload).generate(first.source.tokenizer, 0)
    for engine in engines.values():
        warm_up(engine)
    probe = HostProbe()
    table = Table(title=f"{args.workload}, {args.dtype}, weights {args.quantization}: ms per output token")
    table.add_column("round")
    table.add_column("host")
    for n in engines:
        table.add_column(f"{n} step{'s' if n > 1 else ''}", justify="right")
    tpot: dict[int, list[float]] = {n: [] for n in engines}
    for i in range(args.rounds):
        state = probe.measure()
        for n, engine in engines.items():
            engine.cache.reset()
            tpot[n].append(drive(engine, requests).summary()["tpot_ms"])
        table.add_row(str(i + 1), str(state), *(f"{tpot[n][-1]:.2f}" for n in engines))
        console.print(f"round {i + 1}: {state}; " + ", ".join(f"{n} steps {tpot[n][-1]:.2f} ms" for n in engines))
    table.add_row("median", "", *(f"{statistics.median(tpot[n]):.2f}" for n in engines))
    console.print(table)


if __name__ == "__main__":
    main()
