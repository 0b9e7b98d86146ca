"""Kernels for linear weights a quantization plugin keeps packed (``frame.interfaces.quantization.FORMATS``).

ggml's q4_0, q4_1 and q8_0 blocks run in ``csrc/ggml_linear.cpp`` as the GGUF stores them: AVX2 integer dot
products against x quantized per block of 32 (as llama.cpp computes), or the same arithmetic in plain C++ on CPUs
without AVX2. Formats without a kernel here return None, so the layer multiplies by the dequantised weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from frame.interfaces.quantization import PackedWeight

from frame_platform_cpu import kernels, probe

#: ggml formats ``ggml_linear`` reads, with the number its ``format`` argument takes.
GGML_FORMATS = {"q4_0": 0, "q4_1": 1, "q8_0": 2}

Kernel = Callable[[torch.Tensor], torch.Tensor | None]


def served_formats() -> tuple[str, ...]:
    """The packed formats this CPU runs with a native kernel."""
    return tuple(GGML_FORMATS) if kernels.unavailable_reason() is None else ()


def isa_path() -> str:
    """Which code runs the ggml kernels here: ``avx2`` or ``portable``."""
    return "avx2" if probe.has_avx2_fma() else "portable"


def ggml_linear(packed: PackedWeight, bias: torch.Tensor | None, portable: bool | None = None) -> Kernel | None:
    """``F.linear(x, packed.dequantize(), bias)`` for 2-D float32 or bfloat16 x, up to x's per-block int8
    rounding; None for a format ``ggml_linear`` does not read. ``portable`` forces the plain C++ path (default:
    AVX2 where the CPU has it)."""
    fmt = GGML_FORMATS.get(packed.format)
    if fmt is None or packed.in_features % 32:
        return None
    kernels.load()
    op = torch.ops.frame_cpu.ggml_linear.default
    blocks = packed.tensors["blocks"].contiguous()
    float_bias = None if bias is None else bias.float().contiguous()
    plain = not probe.has_avx2_fma() if portable is None else portable

    def linear(x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
            return None
        return op(x, blocks, fmt, float_bias, plain)

    return linear


def packed_layer_kernel(layer: torch.nn.Module, packed: PackedWeight, gated: bool) -> Kernel | None:
    """The kernel of a linear layer whose weight is ``packed``; ``gated`` for SwiGLU's projection, whose
    ``[gate | up]`` product goes through ``silu(gate) * up`` (the native fused activation for bfloat16)."""
    linear = ggml_linear(packed, getattr(layer, "bias", None))
    return kernels.gated(linear) if linear is not None and gated else linear
