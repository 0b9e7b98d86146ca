"""The linears of a SmolLM2-135M step alone: the cpu platform's packed kernel beside prepacked oneDNN, in GFLOP/s.

    .venv/bin/python benchmarks/gemm_shapes.py [--rows 1,16,64,128,256,4096]

Per row count, two lines:

- ``hot``: each shape called repeatedly on one weight, so the weight stays in the caches;
- ``step``: a whole step's linears in model order over 30 layers' distinct weights (plus the logits), so the
  weights come from memory as they do in the model.

Compare with this CPU's ``vdpbf16ps`` peak (``benchmarks/bf16_peak.cpp``): the gap is what a better GEMM could
still win.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from frame_platform_cpu import kernels

#: (out features, in features, calls per step): QKV, O, gate-up, down for each of 30 layers, then the logits.
SHAPES = [(960, 576, 30), (576, 576, 30), (3072, 576, 30), (576, 1536, 30), (49152, 576, 1)]
LAYERS = 30


def seconds_per_call(fn: Callable[[], object], calls: int) -> float:
    for _ in range(2):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def onednn(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the platform used before the packed kernel: oneDNN on a weight prepacked once."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


KERNELS = {"packed": lambda w: kernels.bfloat16_linear(w, None), "oneDNN": onednn}


def hot_line(rows: int) -> str:
    cells = []
    for out_features, in_features, _ in SHAPES:
        weight = torch.randn(out_features, in_features, dtype=torch.bfloat16)
        x = torch.randn(rows, in_features, dtype=torch.bfloat16)
        calls = 3 if rows * out_features > 2**26 else 20
        rates = []
        for make in KERNELS.values():
            linear = make(weight)
            seconds = seconds_per_call(lambda linear=linear, x=x: linear(x), calls)
            rates.append(2 * rows * out_features * in_features / seconds / 1e9)
        cells.append(f"{out_features}x{in_features} " + "/".join(f"{r:3.0f}" for r in rates))
    return " | ".join(cells)


def step_line(rows: int, weights: list[torch.Tensor]) -> str:
    inputs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in {w.shape[1] for w in weights}}
    flops = sum(2 * rows * w.shape[0] * w.shape[1] for w in weights)
    cells = []
    for name, make in KERNELS.items():
        linears = [(make(w), inputs[w.shape[1]]) for w in weights]
        seconds = min(seconds_per_call(lambda linears=linears: [f(x) for f, x in linears], 1) for _ in range(3))
        cells.append(f"{name} {seconds * 1e3:6.1f} ms {flops / seconds / 1e9:3.0f} GFLOP/s")
    return ", ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,16,64,128,256,4096", help="token rows per linear, comma-separated")
    args = parser.parse_args()
    kernels.load()
    weights = [torch.randn(o, i, dtype=torch.bfloat16) for _ in range(LAYERS) for o, i, _ in SHAPES[:-1]]
    weights.append(torch.randn(*SHAPES[-1][:2], dtype=torch.bfloat16))
    print(f"{torch.get_num_threads()} threads, bfloat16; GFLOP/s as packed/oneDNN")
    for rows in (int(r) for r in args.rows.split(",")):
        print(f"{rows:5d} rows  hot | {hot_line(rows)}")
        print(f"{rows:5d} rows step | {step_line(rows, weights)}")


if __name__ == "__main__":
    main()
