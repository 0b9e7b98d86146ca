"""Kernels for linear weights a quantization plugin keeps packed (``frame.interfaces.quantization.FORMATS``).

ggml's q4_0, q4_1 and q8_0 blocks run in ``csrc/ggml_linear.cpp`` as the GGUF stores them: AVX2 integer dot
products against x quantized per block of 32 (as llama.cpp computes), or the same arithmetic in plain C++ on CPUs
without AVX2. ``int8`` weights whose method allows dynamic activation scales (W8A8) run there too, as q8_0 blocks
whose scale is the row's (in float16). Formats without a kernel here return None, so the layer multiplies by the
dequantised weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from frame.interfaces.quantization import PackedWeight

from frame_platform_cpu import kernels, probe, w8a8

#: ggml formats ``ggml_linear`` reads, with the number its ``format`` argument takes.
GGML_FORMATS = {"q4_0": 0, "q4_1": 1, "q8_0": 2}

Kernel = Callable[[torch.Tensor], torch.Tensor | None]


def served_formats() -> tuple[str, ...]:
    """The packed formats this CPU runs with a native kernel (int8: with dynamic activation scales)."""
    return (*GGML_FORMATS, "int8") if kernels.unavailable_reason() is None else ()


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
    return _block_linear(packed.tensors["blocks"], fmt, bias, portable)


def int8_linear(packed: PackedWeight, bias: torch.Tensor | None, portable: bool | None = None) -> Kernel | None:
    """W8A8 for ``int8`` weights (per output channel) whose method allows dynamic activation scales: the rows as
    q8_0 blocks, each block's scale the row's rounded to float16 (a relative change of at most 2^-11), x quantized
    per block of 32. None for weight-only int8 (``activations='none'``: x must stay as it is), inputs that are not
    a multiple of 32, or scales outside float16's normal range."""
    if getattr(packed, "activations", "none") != "dynamic" or packed.in_features % 32:
        return None
    q, scale = packed.tensors["q"], packed.tensors["scale"].float().reshape(-1, 1)
    half = scale.half()
    if not torch.isfinite(half).all() or bool((half.float() < 2.0**-14).any()):
        return None
    rows, nb = q.shape[0], packed.in_features // 32
    blocks = torch.empty(rows, nb, 34, dtype=torch.uint8)
    blocks[:, :, :2] = half.view(torch.uint8).reshape(rows, 1, 2)
    blocks[:, :, 2:] = q.contiguous().view(torch.uint8).reshape(rows, nb, 32)
    linear = _block_linear(blocks.reshape(rows, nb * 34), GGML_FORMATS["q8_0"], bias, portable)
    smooth = getattr(packed, "input_scale", None)
    if smooth is None:
        return linear
    factors = smooth.float()  # a smoothed weight: the product takes x * input_scale

    def smoothed(x: torch.Tensor) -> torch.Tensor | None:
        return linear((x.float() * factors).to(x.dtype)) if x.dim() == 2 else None

    return smoothed


def _block_linear(blocks: torch.Tensor, fmt: int, bias: torch.Tensor | None, portable: bool | None) -> Kernel:
    kernels.load()
    op = torch.ops.frame_cpu.ggml_linear.default
    blocks = blocks.contiguous()
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
    bias = getattr(layer, "bias", None)
    if packed.format == "int8" and (kernel := w8a8.layer_kernel(packed, bias, gated)) is not None:
        return kernel  # AMX int8 tiles or AVX-512 VNNI, x per token
    linear = int8_linear(packed, bias) if packed.format == "int8" else ggml_linear(packed, bias)
    return kernels.gated(linear) if linear is not None and gated else linear
