"""Kernels for ggml's super-blocks of 256 (q4_K, q6_K, q3_K, q2_K, q5_K, iq4_xs), read as the GGUF stores them.

``csrc/kquant_linear.cpp`` multiplies x (quantized per row and super-block to int8, as llama.cpp's q8_K) by the
file's own blocks, unrepacked, so a K-quant model's resident weight memory is the file's size: served by the
platform, the blocks are copied as they are onto huge pages (``huge_pages.py``) and the file's pages given back;
otherwise they are the file's memory-mapped bytes, read in place. Three paths: AVX-512 BW + VNNI (``vpdpwssd``
on 512-bit vectors), AVX2, and the same integer arithmetic in plain C++; each sums every super-block's products
exactly as integers, so against gguf's dequantised weight the only error is x's rounding to int8 and float32 sums.
Where the CPU has AVX-512 VNNI, ``quantized.ggml_linear`` reads every one of them repacked instead (``repack.py``:
with the portable path's bits, and 1.4-3.3x faster); this module serves the AVX2 and portable paths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights.pages import release_weight_pages

from frame_platform_cpu import huge_pages, kernels, probe

#: Super-block formats ``kquant_linear`` reads, with the number its ``format`` argument takes.
KQUANT_FORMATS = {"q4_k": 0, "q6_k": 1, "q3_k": 2, "q2_k": 3, "q5_k": 4, "iq4_xs": 5}
#: ``path`` argument of each ISA path.
PATHS = {"portable": 0, "avx2": 1, "avx512_vnni": 2}

Kernel = Callable[[torch.Tensor], torch.Tensor | None]


def isa_path() -> str:
    """The path that runs the super-block formats here: ``avx512_vnni``, ``avx2`` or ``portable``."""
    flags = probe.cpu_flags()
    if {"avx512_vnni", "avx512bw"} <= flags:
        return "avx512_vnni"
    return "avx2" if probe.has_avx2_fma() and "f16c" in flags else "portable"


def kquant_linear(packed: PackedWeight, bias: torch.Tensor | None, portable: bool | None = None,
                  vnni: bool | None = None) -> Kernel | None:
    """``F.linear(x, packed.dequantize(), bias)`` for 2-D float32 or bfloat16 x, up to x's int8 rounding per
    super-block; None for a format other than ``KQUANT_FORMATS`` or inputs that are not whole super-blocks.
    ``portable`` forces the plain C++ path, ``vnni`` False the AVX2 one (default: the best this CPU runs)."""
    fmt = KQUANT_FORMATS.get(packed.format)
    if fmt is None or packed.in_features % 256:
        return None
    kernels.load()
    best = isa_path()
    if portable:
        best = "portable"
    elif vnni is False and best == "avx512_vnni":
        best = "avx2"
    path = min(PATHS[best], int(torch.ops.frame_cpu.kquant_best_path()))
    op = torch.ops.frame_cpu.kquant_linear.default
    source = packed.tensors["blocks"]  # the file's mapped bytes
    blocks = huge_pages.resident(source if source.stride(-1) == 1 else source.contiguous())
    release_weight_pages(packed, keep=blocks)  # unless the kernel reads the file's bytes in place
    float_bias = None if bias is None else bias.float().contiguous()

    def linear(x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
            return None
        return op(x, blocks, fmt, float_bias, path)

    return linear
