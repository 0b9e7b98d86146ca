"""W8A8 linears for ``int8`` weights (per output channel) whose method allows dynamic activation scales: the
native ``w8a8_linear`` (``csrc/w8a8_linear.cpp``) on AMX int8 tiles or AVX-512 VNNI, x quantized per row (token)
to int8 at run time.

CPUs with neither (AVX2 only) keep ``quantized.int8_linear``'s q8_0-block kernel, which quantizes x per block of
32 instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from frame.interfaces.quantization import PackedWeight

from frame_platform_cpu import kernels, probe

Kernel = Callable[[torch.Tensor], torch.Tensor | None]

#: The ``path`` argument of the native op: the best this CPU has, AMX tiles, or AVX-512 VNNI.
PATHS = {"auto": 0, "amx": 1, "vnni": 2}


def has_vnni() -> bool:
    """True where the W8A8 kernel runs: AVX-512 VNNI with BW and VL (Cascade Lake, Ice Lake and later Xeons, Zen 4
    and later); AVX-512 BF16 only makes its bfloat16 rounding one instruction."""
    return {"avx512_vnni", "avx512bw", "avx512vl"} <= probe.cpu_flags()


@functools.cache
def amx_int8_usable() -> bool:
    """True when the CPU has AMX int8 tiles and Linux lets this process use them."""
    return "amx_int8" in probe.cpu_flags() and kernels.amx_usable()


def isa_path(in_features: int | None = None) -> str | None:
    """``amx`` or ``avx512_vnni`` for the W8A8 kernel here (AMX needs in_features a multiple of 64), None without
    either."""
    if not has_vnni():
        return None
    return "amx" if amx_int8_usable() and (in_features is None or in_features % 64 == 0) else "avx512_vnni"


def w8a8_linear(packed: PackedWeight, bias: torch.Tensor | None, gated: bool = False,
                path: str = "auto") -> Kernel | None:
    """``F.linear(x, packed.dequantize(), bias)`` for 2-D float32 or bfloat16 x, up to the per-row int8 rounding of
    x (of ``x * packed.input_scale`` for a smoothed weight). ``gated``: SwiGLU's ``silu(gate) * up`` of the ``[gate |
    up]`` product, for bfloat16 x. None where it does not apply: weight-only int8 (``activations='none'``), no
    VNNI, inputs not a multiple of 4, outputs not of 16 (32 gated)."""
    if getattr(packed, "activations", "none") != "dynamic" or not has_vnni():
        return None
    q, scale = packed.tensors["q"], packed.tensors["scale"].float().reshape(-1)
    out_features, in_features = q.shape
    if in_features % 4 or out_features % (32 if gated else 16):
        return None
    if gated:
        q, scale = kernels.pair_gate_with_up(q), kernels.pair_gate_with_up(scale)
        bias = None if bias is None else kernels.pair_gate_with_up(bias)
    kernels.load()
    op = torch.ops.frame_cpu.w8a8_swiglu.default if gated else torch.ops.frame_cpu.w8a8_linear.default
    weights = kernels.pack_weight(q.contiguous(), group=4)
    scales = scale.contiguous()
    sums = q.sum(dim=1, dtype=torch.int32).contiguous()
    float_bias = None if bias is None else bias.float().contiguous()
    smooth = getattr(packed, "input_scale", None)
    smooth = None if smooth is None else smooth.float().contiguous()
    size = out_features // 2 if gated else out_features
    code = PATHS[path]

    def linear(x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16) or (gated and x.dtype != torch.bfloat16):
            return None
        return op(x, weights, scales, sums, float_bias, smooth, size, code)

    return linear


def layer_kernel(packed: PackedWeight, bias: torch.Tensor | None, gated: bool) -> Kernel | None:
    """The W8A8 kernel of a linear layer (``gated``: SwiGLU's projection, the activation fused for bfloat16 x and
    applied after the product for float32 x), or None where ``w8a8_linear`` does not apply."""
    plain = w8a8_linear(packed, bias)
    if plain is None or not gated:
        return plain
    fused = w8a8_linear(packed, bias, gated=True)
    unfused = kernels.gated(plain)

    def swiglu(x: torch.Tensor) -> torch.Tensor | None:
        return fused(x) if fused is not None and x.dtype == torch.bfloat16 else unfused(x)

    return swiglu
