"""The linears of a SmolLM2-135M decode or prefill step alone: prepacked oneDNN bfloat16, as the cpu platform
calls it, per shape and per step, in GFLOP/s.

    .venv/bin/python benchmarks/gemm_shapes.py [--rows 64,128,256,4096]

Compare with this CPU's ``vdpbf16ps`` peak (``benchmarks/bf16_peak.cpp``): the gap is what a better GEMM could
still win. Weights stay hot in the caches here, so a step inside the model (weights from memory) runs a little
slower.
"""

from __future__ import annotations

import argparse
import time

import torch

#: (out features, in features, calls per step): QKV, O, gate-up, down for each of 30 layers, then the logits.
SHAPES = [(960, 576, 30), (576, 576, 30), (3072, 576, 30), (576, 1536, 30), (49152, 576, 1)]


def seconds_per_call(fn, calls: int = 30) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="64,128,256,4096", help="token rows per linear, comma-separated")
    args = parser.parse_args()
    linear = torch.ops.mkldnn._linear_pointwise.default
    print(f"{torch.get_num_threads()} threads, bfloat16, prepacked oneDNN")
    for rows in (int(r) for r in args.rows.split(",")):
        step_seconds = step_flops = 0.0
        cells = []
        for out_features, in_features, calls in SHAPES:
            weight = torch.randn(out_features, in_features, dtype=torch.bfloat16)
            x = torch.randn(rows, in_features, dtype=torch.bfloat16)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            seconds = seconds_per_call(lambda x=x, packed=packed: linear(x, packed, None, "none", [], ""),
                                       calls=3 if rows * out_features > 2**26 else 30)
            flops = 2 * rows * out_features * in_features
            step_seconds += seconds * calls
            step_flops += flops * calls
            cells.append(f"{out_features}x{in_features} {flops / seconds / 1e9:4.0f}")
        print(f"{rows:5d} rows | " + " | ".join(cells)
              + f" | step {step_seconds * 1e3:7.1f} ms, {step_flops / step_seconds / 1e9:4.0f} GFLOP/s")


if __name__ == "__main__":
    main()
