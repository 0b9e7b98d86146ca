"""``frame bench``: throughput and latency side by side with transformers, ``serve``, and experiments.

``frame bench --config experiments/NAME.yaml`` runs an experiment matrix; ``frame bench throughput`` and
``frame bench latency`` compare frame with transformers on one workload; ``frame bench serve`` load-tests a
running server (from :mod:`frame.bench.serve`).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from frame.cli.engine_flags import add_engine_flags, config_from_args
from frame.config import parse_key_values
from frame.errors import FrameUsageError

_SERVE_MODULE = "frame.bench.serve"


def _add_compare(sub: Any, name: str, workload: str, help_text: str) -> None:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--workload", default=workload, help=f"workload name (default: {workload})")
    parser.add_argument("--workload-opt", action="append", metavar="KEY=VALUE", default=[],
                        help="a workload size parameter, e.g. num_requests=8 or prompt_len=[50,400] (repeatable)")
    parser.add_argument("--workload-seed", type=int, default=0, help="seed of the workload's generated requests")
    parser.add_argument("--repeat", type=int, default=1, help="timed runs per system; the median is reported")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip the transformers baseline")
    parser.add_argument("--baseline-batch-size", type=int, default=None,
                        help="transformers batch size (default: all requests, up to max_num_seqs)")
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    add_engine_flags(parser)
    parser.set_defaults(bench=_run_compare)


def _add_serve(sub: Any) -> None:
    help_text = "load-test a running frame server with concurrent requests"
    try:
        module = importlib.import_module(_SERVE_MODULE)
    except ModuleNotFoundError as err:
        if err.name != _SERVE_MODULE:
            raise
        # No options to parse: every argument (even ``--url``) is taken as a word, so the user sees why the
        # command is unavailable rather than an "unrecognized arguments" error.
        parser = sub.add_parser("serve", help=help_text, description=help_text, prefix_chars="\x00",
                                add_help=False)
        parser.add_argument("rest", nargs="*")
        parser.set_defaults(bench=_serve_missing)
        return
    parser = sub.add_parser("serve", help=help_text, description=help_text)
    module.add_arguments(parser)
    parser.set_defaults(bench=module.run)


def _serve_missing(args: argparse.Namespace) -> int:
    raise FrameUsageError(f"`frame bench serve` is not available in this installation ({_SERVE_MODULE} is "
                          "missing); reinstall frame or use `frame bench throughput`.")


def _add_perplexity(sub: Any) -> None:
    help_text = "perplexity on a fixed public-domain text: dense dtypes and quantizations side by side"
    parser = sub.add_parser("perplexity", help=help_text, description=help_text)
    parser.add_argument("--variant", action="append", default=None, metavar="DTYPE[+QUANTIZATION][@KV_DTYPE]",
                        help="one system to score, e.g. float32, bfloat16, float32+gguf, float32+int8, bfloat16@int8 "
                        "(bfloat16 weights, int8 KV cache; without @, --kv-cache-dtype applies) (repeatable; "
                        "default: float32, bfloat16 where the platform has it, and float32 with every installed "
                        "quantization that serves the model)")
    parser.add_argument("--n-ctx", type=int, default=512, help="tokens per chunk; the second half is scored")
    parser.add_argument("--chunks", type=int, default=None, help="score only the first N chunks (default: all)")
    parser.add_argument("--text", type=Path, default=None,
                        help="score this UTF-8 text file instead of the shipped one (which holds about 2,900 tokens: "
                        "longer chunks need a longer text)")
    parser.add_argument("--json", type=Path, default=None, help="write the results to this JSON file")
    add_engine_flags(parser)
    parser.set_defaults(bench=_run_perplexity)


def _run_perplexity(args: argparse.Namespace) -> int:
    from frame.bench.perplexity import TEXT, render, run_variants

    console = Console(width=None if Console().is_terminal else 160)
    text = args.text.read_text(encoding="utf-8") if args.text else None
    results = run_variants(config_from_args(args), args.variant, args.n_ctx, console, args.chunks, text)
    render(results, console, (args.text or TEXT).name)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.as_json() for r in results], indent=2))
        console.print(f"results written to {args.json}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", dest="experiment", default=None,
                        help="run the experiment described by this YAML file (see docs/experiments.md)")
    parser.add_argument("--out", type=Path, default=None, help="experiment results folder (default: results/NAME/)")
    sub = parser.add_subparsers(dest="bench_command")
    _add_compare(sub, "throughput", "mixed_batch", "offline throughput: frame vs transformers on one batch")
    _add_compare(sub, "latency", "single_stream", "single-request latency: frame vs transformers")
    _add_perplexity(sub)
    _add_serve(sub)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "bench", None) is not None:
        return int(args.bench(args) or 0)
    if args.experiment:
        return _run_experiment(args)
    raise FrameUsageError("Say what to run: `frame bench --config experiments/NAME.yaml`, or one of "
                          "`frame bench throughput|latency|perplexity|serve`.")


def _run_compare(args: argparse.Namespace) -> int:
    from frame.bench.compare import compare, render

    if args.repeat < 1:
        raise FrameUsageError("--repeat must be at least 1.", param="repeat")
    console = Console(width=None if Console().is_terminal else 160)
    params = parse_key_values(args.workload_opt, "--workload-opt")
    comparison = compare(args.workload, params, config_from_args(args), seed=args.workload_seed, repeat=args.repeat,
                         baseline=args.baseline, batch_size=args.baseline_batch_size, console=console)
    render(comparison, console)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(comparison.as_json(), indent=2))
        console.print(f"results written to {args.json}")
    return 0


def _run_experiment(args: argparse.Namespace) -> int:
    from frame.bench.experiment import ExperimentRunner, load_experiment
    from frame.bench.report import failures, rich_table, write_all

    spec = load_experiment(args.experiment)
    runner = ExperimentRunner(spec)
    console = Console(width=None if Console().is_terminal else 160)
    out = args.out or Path("results") / spec.name
    rows = []
    plan = runner.plan()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        cells = progress.add_task(f"{spec.name}: cells", total=len(plan))
        for options, workload in plan:
            # escape: "[router=...]" is otherwise read as rich markup and vanishes from the line
            label = escape(f"{workload.name} [{', '.join(f'{k}={v}' for k, v in options.items())}]")
            tokens = progress.add_task(f"  {label}", total=None)
            rows.append(runner.run_cell(options, workload, lambda n, t=tokens: progress.advance(t, n)))
            progress.remove_task(tokens)
            progress.advance(cells)
            if not console.is_terminal:  # no live bar in a log file: one line per cell instead
                row = rows[-1]
                status = row["error"] or f"{row['output_tok_s']:.1f} output tok/s in {row['elapsed_s']:.1f} s"
                console.print(escape(f"[{len(rows)}/{len(plan)}] ") + f"{label}: {escape(status)}", soft_wrap=True)
    console.print(rich_table(rows, spec.name))
    for line in failures(rows):
        console.print(f"[red]failed[/red] {line}", soft_wrap=True)
    paths = write_all(rows, out, spec.name)
    failed = len(failures(rows))
    console.print(f"{len(rows) - failed} of {len(rows)} cells ran; results in {out}/ "
                  f"({', '.join(p.name for p in paths.values())})")
    return 1 if failed == len(rows) else 0
