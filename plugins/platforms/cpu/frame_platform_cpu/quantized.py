"""Kernels for linear weights a quantization plugin keeps packed (``frame.interfaces.quantization.FORMATS``).

ggml's q4_0, q4_1, q8_0, q5_0, q5_1 and iq4_nl blocks run in ``csrc/ggml_linear.cpp`` against x quantized per
block of 32 (as llama.cpp computes), repacked once at load so that each vector holds many output rows (16 for AVX-512
VNNI's ``vpdpbusd``, 8 for AVX2's ``vpmaddubsw``, ``csrc/ggml_repacked_avx2.h``), or as the GGUF stores them in
plain C++ on CPUs without AVX2. Each block's 32 integer products are summed exactly, so the only error against gguf's
dequantised weight is x's rounding to int8 per block and float32 sums. ``int8`` weights whose method allows dynamic
activation scales (W8A8) run there too, as q8_0 blocks whose scale is the row's (in float16). The formats of
256-value super-blocks (q4_K, q5_K, q6_K, q3_K, q2_K, iq4_xs) run on the file's own blocks in ``kquant``. Formats
without a kernel here return None, so the layer multiplies by the dequantised weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights.pages import release_weight_pages

from frame_platform_cpu import huge_pages, kernels, kquant, probe, w8a8
from frame_platform_cpu.repack import GGML_FORMATS, REPACKED_KQUANTS, repack_by_rows

Kernel = Callable[[torch.Tensor], torch.Tensor | None]


def served_formats() -> tuple[str, ...]:
    """The packed formats this CPU runs with a native kernel (int8: with dynamic activation scales)."""
    return (*GGML_FORMATS, *kquant.KQUANT_FORMATS, "int8") if kernels.unavailable_reason() is None else ()


def has_vnni() -> bool:
    """True where ``ggml_linear_repacked`` runs with AVX-512 VNNI and BW (elsewhere with AVX2)."""
    return {"avx512_vnni", "avx512bw"} <= probe.cpu_flags()


def has_repacked() -> bool:
    """True where ``ggml_linear_repacked`` runs: AVX-512 VNNI or AVX2, in the kernels built here."""
    kernels.load()
    return bool(torch.ops.frame_cpu.ggml_repacked_available())


def isa_path() -> str:
    """Which code runs the ggml kernels here: ``avx512_vnni`` or ``avx2`` (both on repacked blocks) or ``portable``."""
    if has_vnni():
        return "avx512_vnni"
    return "avx2" if probe.has_avx2_fma() else "portable"


def ggml_linear(packed: PackedWeight, bias: torch.Tensor | None, portable: bool | None = None,
                vnni: bool | None = None) -> Kernel | None:
    """``F.linear(x, packed.dequantize(), bias)`` for 2-D float32 or bfloat16 x, up to x's per-block int8
    rounding; None for a format neither ``ggml_linear`` nor ``kquant`` reads. ``portable`` forces the plain C++
    path, ``vnni`` False ggml's own layout read with AVX2 (default: the repacked blocks, AVX-512 VNNI or AVX2 as
    the CPU has them; for K-quants ``vnni`` picks kquant's path)."""
    if packed.format in REPACKED_KQUANTS and not portable and vnni is not False and has_vnni() \
            and packed.in_features % 256 == 0 and kernels.unavailable_reason() is None:
        kernels.load()
        linear = _repacked_linear(packed.tensors["blocks"], REPACKED_KQUANTS[packed.format], bias)
        release_weight_pages(packed)
        return linear
    if packed.format in kquant.KQUANT_FORMATS:
        return kquant.kquant_linear(packed, bias, portable, vnni)
    fmt = GGML_FORMATS.get(packed.format)
    if fmt is None or packed.in_features % 32:
        return None
    linear = _block_linear(packed.tensors["blocks"], fmt, bias, portable, vnni)
    if getattr(linear, "own_copy", False):  # the kernel reads its own copy; the file's pages need not stay resident
        release_weight_pages(packed)
    return linear


def int8_linear(packed: PackedWeight, bias: torch.Tensor | None, portable: bool | None = None,
                vnni: bool | None = None) -> Kernel | None:
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
    linear = _block_linear(blocks.reshape(rows, nb * 34), GGML_FORMATS["q8_0"], bias, portable, vnni)
    smooth = getattr(packed, "input_scale", None)
    if smooth is None:
        return linear
    factors = smooth.float()  # a smoothed weight: the product takes x * input_scale

    def smoothed(x: torch.Tensor) -> torch.Tensor | None:
        return linear((x.float() * factors).to(x.dtype)) if x.dim() == 2 else None

    return smoothed


def _block_linear(blocks: torch.Tensor, fmt: int, bias: torch.Tensor | None, portable: bool | None,
                  vnni: bool | None = None) -> Kernel:
    kernels.load()
    if not portable and vnni is not False and torch.ops.frame_cpu.ggml_repacked_available():
        return _repacked_linear(blocks, fmt, bias)
    op = torch.ops.frame_cpu.ggml_linear.default
    blocks = blocks.contiguous()
    float_bias = None if bias is None else bias.float().contiguous()
    plain = not probe.has_avx2_fma() if portable is None else portable

    def linear(x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
            return None
        return op(x, blocks, fmt, float_bias, plain)

    return linear


def _repacked_linear(blocks: torch.Tensor, fmt: int, bias: torch.Tensor | None) -> Kernel:
    """The kernel over ``blocks`` repacked once (``repack.py``): AVX-512 VNNI, or AVX2."""
    op = torch.ops.frame_cpu.ggml_linear_repacked.default
    out_features = blocks.shape[0]
    qs, scales = (huge_pages.resident(t) for t in repack_by_rows(blocks.contiguous(), fmt))
    float_bias = None if bias is None else bias.float().contiguous()

    def linear(x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
            return None
        return op(x, qs, scales, fmt, out_features, float_bias)

    linear.own_copy = True  # type: ignore[attr-defined]
    linear.swiglu = lambda: _repacked_swiglu(linear, qs, scales, fmt, out_features, float_bias)  # type: ignore
    return linear


def _repacked_swiglu(linear: Kernel, qs: torch.Tensor, scales: torch.Tensor, fmt: int, out_features: int,
                     bias: torch.Tensor | None) -> Kernel:
    """SwiGLU's ``silu(gate) * up`` over a repacked ``[gate | up]`` weight: for bfloat16 x the activation runs in the
    product's epilogue (``ggml_swiglu_repacked``, the same bits as the product then ``silu_and_mul``), saving the
    wide output and an op call a layer; float32 x takes the product and torch's activation."""
    op, intermediate = torch.ops.frame_cpu.ggml_swiglu_repacked.default, out_features // 2
    unfused = kernels.gated(linear)
    if out_features % 32 or not has_vnni():  # the epilogue is written for AVX-512 only
        return unfused

    def swiglu(x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 2 or x.dtype != torch.bfloat16:
            return unfused(x)
        return op(x, qs, scales, fmt, intermediate, bias)

    return swiglu


def mixed_linear(packed: PackedWeight, bias: torch.Tensor | None) -> Kernel | None:
    """A weight whose row blocks come as several parts (``frame.weights.MixedRows``: a fused QKV or gate-up, each
    part a view of the file). Parts of one format: one kernel over their rows joined, a copy that lives only until
    the kernel repacks it (AVX-512 VNNI) or a rewriting copies it; parts in different formats: each part's own
    kernel, the outputs joined along the features. Either way the parts' file pages read are given back. None (the
    reference) when a part has no kernel here."""
    parts = packed.parts
    joined = PackedWeight.cat(parts) if len({p.format for p in parts}) == 1 else None
    if joined is not None and (linear := ggml_linear(joined, bias)) is not None:
        del joined
        _release(parts)
        return linear
    offsets = packed.offsets
    kernels_ = [ggml_linear(part, None if bias is None else bias[lo:hi])
                for part, lo, hi in zip(parts, offsets[:-1], offsets[1:], strict=True)]
    if any(part is None for part in kernels_):
        return None

    def linear(x: torch.Tensor) -> torch.Tensor | None:
        outs = [part(x) for part in kernels_]  # type: ignore[misc]
        return None if any(out is None for out in outs) else torch.cat(outs, dim=-1)

    return linear


def _release(parts: list[PackedWeight]) -> None:
    for part in parts:
        release_weight_pages(part)


def packed_layer_kernel(layer: torch.nn.Module, packed: PackedWeight, gated: bool) -> Kernel | None:
    """The kernel of a linear layer whose weight is ``packed``; ``gated`` for SwiGLU's projection, whose
    ``[gate | up]`` product goes through ``silu(gate) * up`` (the native fused activation for bfloat16)."""
    bias = getattr(layer, "bias", None)
    if packed.format == "mixed":
        linear = mixed_linear(packed, bias)
        return _gated(linear) if linear is not None and gated else linear
    if packed.format == "int8" and (kernel := w8a8.layer_kernel(packed, bias, gated)) is not None:
        return kernel  # AMX int8 tiles or AVX-512 VNNI, x per token
    linear = int8_linear(packed, bias) if packed.format == "int8" else ggml_linear(packed, bias)
    return _gated(linear) if linear is not None and gated else linear


def _gated(linear: Kernel) -> Kernel:
    """SwiGLU after a product kernel: in the product's own epilogue where the kernel offers one (``swiglu``: the
    repacked ggml blocks), else the product then the activation."""
    swiglu = getattr(linear, "swiglu", None)
    return swiglu() if swiglu is not None else kernels.gated(linear)
