"""The platform's C++ kernels (``csrc/*.cpp``: the packed bfloat16 linear on AVX-512 BF16 or AMX tiles, with
SwiGLU in its epilogue for the gate-up projection, fused residual-add RMSNorm, fused SwiGLU activation, in-place
rotary).

Built for this CPU on first use (:mod:`frame.native`).

``python -m frame_platform_cpu.build`` builds them ahead of time (``make setup`` does).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from frame import native

from frame_platform_cpu import huge_pages, probe

NAME = "frame_cpu"
SOURCES = tuple(sorted((Path(__file__).parent / "csrc").glob("*.cpp")))
CFLAGS = ("-O3", "-march=native")


@functools.cache  # hashes the sources and reads /proc/cpuinfo: asked once per layer at load
def unavailable_reason() -> str | None:
    """None when the kernels are built or can be built here; otherwise why not."""
    return native.unavailable_reason(NAME, SOURCES, CFLAGS)


def load() -> None:
    """Make ``torch.ops.frame_cpu.*`` available, building the library if needed."""
    native.load_library(NAME, SOURCES, CFLAGS)


def pack_weight(weight: torch.Tensor, group: int = 2) -> torch.Tensor:
    """``weight`` [out, in] in ``packed_linear``'s layout: panels of 32 output columns (a last one of 16 when
    ``out`` is an odd multiple of 16), each holding the columns' weights for input pairs side by side,
    [out / 32][in / 2][32][2], flattened. ``group`` 4 puts four inputs side by side instead, [out / 32][in /
    4][32][4]: the int8 layout of ``w8a8_linear`` (AMX's and VNNI's four bytes per column)."""
    out_features, in_features = weight.shape
    whole = out_features // 32 * 32
    parts = [weight[:whole].reshape(-1, 32, in_features // group, group).permute(0, 2, 1, 3).reshape(-1)]
    if whole < out_features:
        parts.append(weight[whole:].reshape(-1, 16, in_features // group, group).permute(0, 2, 1, 3).reshape(-1))
    return huge_pages.resident(torch.cat(parts).contiguous())


def pack_swiglu_weight(weight: torch.Tensor) -> torch.Tensor:
    """SwiGLU's ``[gate | up]`` weight [2 * intermediate, in] for ``packed_swiglu``: each 32-column panel holds 16
    gate columns, then the 16 up columns of the same features."""
    return pack_weight(pair_gate_with_up(weight))


def pair_gate_with_up(rows: torch.Tensor) -> torch.Tensor:
    """Reorder ``[gate | up]`` rows (or a bias) as gate 0-15, up 0-15, gate 16-31, up 16-31, ..."""
    intermediate = rows.shape[0] // 2
    return rows.reshape(2, intermediate // 16, 16, *rows.shape[1:]).transpose(0, 1).reshape(rows.shape)


@functools.cache
def amx_usable() -> bool:
    """True when the CPU has AMX BF16 tiles, the kernels were built with them and Linux lets this process use them
    (``amx_linear.cpp``)."""
    if not probe.has_amx():
        return False
    load()
    return bool(torch.ops.frame_cpu.amx_available())


def _packed_op(in_features: int, amx, avx512):
    """The AMX op where the tiles run this shape (inputs a multiple of 32), else the AVX-512 BF16 one: on a Xeon
    with AMX the tiles ran a step's linears 1.7x faster at 8 rows and 4-7x from 64 rows (gemm_shapes.py)."""
    return amx if in_features % 32 == 0 and amx_usable() else avx512


def bfloat16_linear(weight: torch.Tensor, bias: torch.Tensor | None, float_output: bool = False):
    """``F.linear`` over a bfloat16 ``weight`` for 2-D bfloat16 inputs of any number of rows.

    ``float_output`` (the output projection, whose logits the sampler takes in float32): the native kernels' float32
    sums are returned as they are, unrounded, which spares a decode step the bfloat16 logits and their conversion
    (``[64, 49152]``: about 1 ms a step of the mixed batch on a Xeon with AMX); on the oneDNN fallback the output
    stays bfloat16.

    The native ``packed_linear`` (``amx_linear`` on CPUs with AMX tiles, same packed weight) on a weight packed
    once (``pack_weight``) on CPUs with AVX-512 BF16, wherever
    the shape allows (an even ``in`` and ``out`` a multiple of 16, as every model here has): on this machine's
    SmolLM2-135M linears it runs a decode step's weights 14% faster than prepacked oneDNN at 64 rows, and matches
    the old one-row kernel. Otherwise oneDNN on a weight prepacked once into its blocked layout (bitwise
    ``F.linear``, which would repack on every call)."""
    load()
    out_features, in_features = weight.shape
    if probe.has_avx512_bf16() and out_features % 16 == 0 and in_features % 2 == 0:
        ops = torch.ops.frame_cpu
        if float_output:
            op = _packed_op(in_features, ops.amx_linear_float.default, ops.packed_linear_float.default)
        else:
            op = _packed_op(in_features, ops.amx_linear.default, ops.packed_linear.default)
        packed = pack_weight(weight)
        float_bias = None if bias is None else bias.float().contiguous()  # the kernel adds it before rounding

        def native_linear(x: torch.Tensor) -> torch.Tensor:
            if x.dtype != torch.bfloat16 or x.dim() != 2:
                return F.linear(x, weight, bias)
            return op(x, packed, float_bias, out_features)

        return native_linear
    pointwise = torch.ops.mkldnn._linear_pointwise.default
    prepacked = torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def onednn_linear(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            return F.linear(x, weight, bias)
        return pointwise(x, prepacked, bias, "none", [], "")

    return onednn_linear


def pack_weight_f32(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] (float32, or bfloat16 kept as it is) in the layout this build's ``packed_linear_f32``
    reads, flattened: panels of 16 output columns, each holding the 16 columns' weights side by side for every input
    feature, [out / 16][in][16]; on AVX-512 a bfloat16 weight's pairs of panels hold two columns in each 32-bit lane
    (``csrc/packed_linear_f32.cpp``), so the layout is the kernel's to choose."""
    load()
    return huge_pages.resident(torch.ops.frame_cpu.pack_weight_f32.default(weight))


def float32_linear(weight: torch.Tensor, bias: torch.Tensor | None):
    """``F.linear`` over a float32 or bfloat16 ``weight`` for 2-D inputs on CPUs with AVX2 and FMA, computed in
    float32: the native ``packed_linear_f32`` on a weight packed once. For float32 it beat MKL's float32 GEMM at
    every row count measured on a Zen 3 core (1.2x at one row, 3x at 2-8 rows, where speculative decoding
    verifies its drafts, 1.1-1.5x at 64). For bfloat16 (storage only: no bfloat16 dot product on such CPUs) it
    widens each weight in registers and rounds the result once, as torch's bfloat16 matmul does; x may be
    float32 or bfloat16 then. None where it does not apply (no AVX2, ``out`` not a multiple of 16), which keeps
    torch's path."""
    load()
    out_features = weight.shape[0]
    if not probe.has_avx2_fma() or out_features % 16 or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    op, packed = torch.ops.frame_cpu.packed_linear_f32.default, pack_weight_f32(weight)
    float_bias = None if bias is None else bias.float().contiguous()
    inputs = (torch.float32, weight.dtype)

    def native_linear(x: torch.Tensor) -> torch.Tensor | None:
        if x.dtype not in inputs or x.dim() != 2:
            return None
        return op(x, packed, float_bias, out_features)

    return native_linear


def float32_swiglu_projection(weight: torch.Tensor, bias: torch.Tensor | None):
    """SwiGLU's ``silu(gate) * up`` of ``[gate | up] = x W^T + b`` with the packed float32-compute matmul, then
    the activation; None where the matmul does not apply."""
    linear = float32_linear(weight, bias)
    return None if linear is None else gated(linear)


def gated(linear):
    """A ``[gate | up]`` product kernel followed by SwiGLU's activation (the fused native one for bfloat16 and
    float32, torch's for other dtypes); declines whenever ``linear`` does."""
    act = fused_silu_and_mul()

    def swiglu(x: torch.Tensor) -> torch.Tensor | None:
        product = linear(x)
        if product is None:
            return None
        fused = act(product)
        if fused is not None:
            return fused
        gate, up = product.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    return swiglu


def bfloat16_swiglu_projection(weight: torch.Tensor, bias: torch.Tensor | None):
    """``silu(gate) * up`` of ``[gate | up] = x W^T + b`` for 2-D bfloat16 inputs, the activation applied in the
    packed matmul's epilogue; None without AVX-512 BF16 or when the shape does not allow it (an odd ``in``, an
    intermediate size that is not a multiple of 16), which keeps the layer's torch path."""
    load()
    intermediate, in_features = weight.shape[0] // 2, weight.shape[1]
    if not probe.has_avx512_bf16() or intermediate % 16 or in_features % 2:
        return None
    op = _packed_op(in_features, torch.ops.frame_cpu.amx_swiglu.default, torch.ops.frame_cpu.packed_swiglu.default)
    packed = pack_swiglu_weight(weight)
    paired_bias = None if bias is None else pair_gate_with_up(bias).float().contiguous()

    def swiglu(x: torch.Tensor) -> torch.Tensor | None:
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            return None
        return op(x, packed, paired_bias, intermediate)

    return swiglu


#: The activations' dtypes the native norm, SwiGLU activation and rotary take.
NATIVE_ACTIVATIONS = (torch.bfloat16, torch.float32)


def fused_add_rms_norm(weight: torch.Tensor, eps: float):
    """Residual add plus RMSNorm in one native pass for bfloat16 or float32 rows of the weight's dtype (without a
    residual, the norm alone: a model's first); None (torch's path) for others."""
    load()
    op, plain = torch.ops.frame_cpu.add_rms_norm.default, torch.ops.frame_cpu.plain_rms_norm.default

    def norm(x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        if x.dtype != weight.dtype or x.dim() != 2 or (residual is not None and residual.dtype != x.dtype):
            return None
        if residual is None:
            return plain(x, weight, eps), x
        return op(x, residual, weight, eps)

    return norm


def _rows_of_activations(op):
    """``op`` (a native gated activation) for 2-D bfloat16 or float32 rows; None (torch's path) otherwise."""

    def act(x: torch.Tensor) -> torch.Tensor | None:
        if x.dtype not in NATIVE_ACTIVATIONS or x.dim() != 2:
            return None
        return op(x)

    return act


def fused_silu_and_mul():
    """SwiGLU's ``silu(gate) * up`` in one native pass for bfloat16 or float32 rows; None (torch's path)
    otherwise."""
    load()
    return _rows_of_activations(torch.ops.frame_cpu.silu_and_mul.default)


def fused_gelu_tanh_and_mul():
    """GeGLU's ``gelu_tanh(gate) * up`` (Gemma's activation) in one native pass for bfloat16 or float32 rows; None
    (torch's path) otherwise."""
    load()
    return _rows_of_activations(torch.ops.frame_cpu.gelu_tanh_and_mul.default)


def _norm_weight(weight: torch.Tensor, offset: float, upcast: bool) -> torch.Tensor:
    """The weight the native row norm takes: ``offset + w`` in float32 where the norm multiplies in float32 (its
    float32 dtype tells the kernel so), else the weight as it is."""
    return (offset + weight.float()).contiguous() if upcast else weight.contiguous()


def fused_rms_norm(weight: torch.Tensor, eps: float, offset: float = 0.0):
    """A norm of rows weighted in float32, ``(rms_norm(x.float()) * (offset + w)).to(x.dtype)``
    (``frame.layers.UpcastRMSNorm``), in one native pass for bfloat16 or float32 rows; None otherwise."""
    load()
    op = torch.ops.frame_cpu.rms_norm.default
    folded = _norm_weight(weight, offset, upcast=True)

    def norm(x: torch.Tensor) -> torch.Tensor | None:
        if x.dtype not in NATIVE_ACTIVATIONS or x.dim() != 2:
            return None
        return op(x, folded, eps)

    return norm


def fused_head_rms_norm(weight: torch.Tensor, eps: float, offset: float = 0.0, upcast: bool = False):
    """Each head of ``x [tokens, heads, head_dim]`` normalised in place with one ``[head_dim]`` weight
    (``frame.layers.HeadNorm`` per head: Gemma 3 ``upcast``, Qwen 3 rounding before the weight as Llama's norm);
    None where the dtypes do not fit (torch's path)."""
    load()
    op = torch.ops.frame_cpu.rms_norm_heads_.default
    kept = _norm_weight(weight, offset, upcast)

    def norm(x: torch.Tensor) -> bool | None:
        if x.dtype not in NATIVE_ACTIVATIONS or x.dim() != 3 or x.stride(2) != 1:
            return None
        if kept.dtype != x.dtype and not upcast:  # a float32 weight would multiply before rounding
            return None
        op(x, kept, eps)
        return True

    return norm


def fused_rotate_halves():
    """Rotary embedding in place in one native pass for bfloat16 (bitwise torch's result) or float32; None
    otherwise."""
    load()
    op = torch.ops.frame_cpu.rotate_halves_.default

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool | None:
        if x.dtype not in NATIVE_ACTIVATIONS or cos.dtype != x.dtype or x.dim() != 3 or x.stride(2) != 1:
            return None
        op(x, cos, sin)
        return True

    return rotate


def greedy_tokens():
    """Each row's argmax of the logits into an int64 ``out`` in one native pass (``csrc/row_argmax.cpp``): numpy's
    answer, the first maximum or the first NaN. Logits of another dtype are widened first (exactly)."""
    load()
    op = torch.ops.frame_cpu.row_argmax_into.default

    def argmax(logits: torch.Tensor, out: torch.Tensor) -> None:
        op(logits if logits.dtype == torch.float32 else logits.float(), out)

    return argmax
