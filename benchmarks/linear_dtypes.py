"""A SmolLM2-135M step's linears (30 layers' distinct weights and the logits, so weights come from memory as in the
model) in each weight format the cpu platform serves on this CPU, in ms per step, GFLOP/s and weight GB/s.

    .venv/bin/python benchmarks/linear_dtypes.py [--rows 1,8,64,256] [--formats q4_1,q8_0]

Formats: torch's float32 ``F.linear`` (MKL), the packed float32 kernel, bfloat16 weights in that kernel (storage
only, float32 arithmetic: the AVX2 / AVX-512-without-BF16 path), the AVX-512 BF16 packed kernel where the CPU has
it, the ggml q8_0 / q4_1 blocks kept packed, and ``int8`` W8A8 (x per token) where the CPU has VNNI. Compare the
GFLOP/s with ``cpu_floor.cpp``'s peaks and the GB/s with its read bandwidth: one-row steps are bound by the
bytes, large ones by the arithmetic.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from frame.weights import GGMLWeight
from frame_platform_cpu import kernels, probe, quantized, w8a8
from frame_quantization_int8.method import Int8Method

#: (out features, in features, calls per step): QKV, O, gate-up, down for each of 30 layers, then the logits.
SHAPES = [(960, 576, 30), (576, 576, 30), (3072, 576, 30), (576, 1536, 30), (49152, 576, 1)]

Linear = Callable[[torch.Tensor], torch.Tensor]


def formats() -> dict[str, tuple[Callable[[torch.Tensor], Linear], torch.dtype]]:
    """name -> (build a linear from a float32 weight, the dtype of x)."""
    out: dict[str, tuple[Callable[[torch.Tensor], Linear], torch.dtype]] = {
        "float32 torch (MKL)": (lambda w: lambda x: F.linear(x, w), torch.float32)}
    if probe.has_avx2_fma():
        out["float32 packed"] = (lambda w: kernels.float32_linear(w, None), torch.float32)
        out["bfloat16 storage packed"] = (lambda w: kernels.float32_linear(w.bfloat16(), None), torch.bfloat16)
    if probe.has_avx512_bf16():
        out["bfloat16 avx512_bf16 packed"] = (lambda w: kernels.bfloat16_linear(w.bfloat16(), None), torch.bfloat16)
    for fmt in ("q8_0", "q4_1"):
        out[f"{fmt} packed"] = (lambda w, f=fmt: quantized.ggml_linear(GGMLWeight.quantized(f, w), None),
                                torch.float32)
    if w8a8.has_vnni():
        out[f"int8 w8a8 {w8a8.isa_path()}"] = (lambda w: w8a8.w8a8_linear(Int8Method().quantize("w", w), None),
                                                  torch.bfloat16)
    return out


def weight_bytes(name: str, out_f: int, in_f: int) -> float:
    per_value = {"q8_0": 34 / 32, "q4_1": 20 / 32, "int8": 1}.get(name.split()[0], 2 if "bfloat16" in name else 4)
    return out_f * in_f * per_value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,8,64,256", help="token rows per linear, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="steps timed per row count (best is kept)")
    parser.add_argument("--formats", default="", help="only the formats whose name contains one of these "
                        "comma-separated words (e.g. q4_1,q8_0)")
    args = parser.parse_args()
    wanted = [w for w in args.formats.split(",") if w]
    kernels.load()
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(o, i, generator=gen) * 0.02, calls) for o, i, calls in SHAPES]
    print(f"threads {torch.get_num_threads()}; {probe.bf16_path()=}")
    for name, (build, dtype) in formats().items():
        if wanted and not any(w in name for w in wanted):
            continue
        linears = [(build(w), w.shape, calls) for w, calls in weights for _ in range(calls)]
        step_bytes = sum(weight_bytes(name, *shape) for _, shape, _ in linears)
        for rows in (int(r) for r in args.rows.split(",")):
            x = {i: torch.randn(rows, i, generator=gen).to(dtype) for _, i, _ in SHAPES}
            best = float("inf")
            for _ in range(args.repeat):
                start = time.perf_counter()
                for linear, (_, i), _ in linears:
                    linear(x[i])
                best = min(best, time.perf_counter() - start)
            flop = sum(2 * rows * o * i for _, (o, i), _ in linears)
            print(f"{name:28s} rows {rows:4d}: {best * 1e3:8.1f} ms/step  {flop / best / 1e9:7.1f} GFLOP/s  "
                  f"{step_bytes / best / 1e9:6.1f} weight GB/s")


if __name__ == "__main__":
    main()
