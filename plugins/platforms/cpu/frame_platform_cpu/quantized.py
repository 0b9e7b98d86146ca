"""Kernels for linear weights a quantization plugin keeps packed (``frame.interfaces.quantization.FORMATS``).

ggml's q4_0, q4_1 and q8_0 blocks run in ``csrc/ggml_linear.cpp`` against x quantized per block of 32 (as
llama.cpp computes): on CPUs with AVX-512 VNNI repacked once at load for ``vpdpbusd`` (16 output rows a vector),
elsewhere as the GGUF stores them with AVX2 integer dot products, or the same arithmetic in plain C++ on CPUs
without AVX2. ``int8`` weights whose method allows dynamic activation scales (W8A8) run there too, as q8_0 blocks
whose scale is the row's (in float16). The k-quants are rewritten once at load into blocks those kernels read:
q4_K as q4_1 (the same nibbles; each 32-value sub-block's scale d * sc and min dmin * m rounded to float16, a
relative change of at most 2^-11), q6_K as q8_0 (its values requantized to 8 bits per block of 32, within half an
8-bit step). Formats without a kernel here return None, so the layer multiplies by the dequantised weight.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights import GGMLWeight

from frame_platform_cpu import kernels, probe, w8a8

#: ggml formats ``ggml_linear`` reads, with the number its ``format`` argument takes.
GGML_FORMATS = {"q4_0": 0, "q4_1": 1, "q8_0": 2}
#: k-quant formats and the block format each is rewritten into at load.
K_QUANTS = {"q4_k": "q4_1", "q6_k": "q8_0"}

Kernel = Callable[[torch.Tensor], torch.Tensor | None]


def served_formats() -> tuple[str, ...]:
    """The packed formats this CPU runs with a native kernel (int8: with dynamic activation scales)."""
    return (*GGML_FORMATS, *K_QUANTS, "int8") if kernels.unavailable_reason() is None else ()


def has_vnni() -> bool:
    """True where ``ggml_linear_repacked`` runs: AVX-512 VNNI and BW."""
    return {"avx512_vnni", "avx512bw"} <= probe.cpu_flags()


def isa_path() -> str:
    """Which code runs the ggml kernels here: ``avx512_vnni`` (repacked blocks), ``avx2`` or ``portable``."""
    if has_vnni():
        return "avx512_vnni"
    return "avx2" if probe.has_avx2_fma() else "portable"


def repack_blocks(blocks: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml blocks ``[out, in / 32 * block bytes]`` in ``ggml_linear_repacked``'s layout: output rows in groups of
    16 (the last padded with zero rows), per group and block the values as ``[quads][16 rows][4 bytes]`` (q4_0 /
    q4_1: ggml's 16 nibble bytes, 4 chunks; q8_0: its 32 bytes XOR 0x80, i.e. q + 128 unsigned, 8 chunks) and
    the 16 rows' float16 scales (d, then m for q4_1). Returns ``(qs uint8 [groups, blocks, quads, 16, 4], scales
    float16 [groups, blocks, 1 or 2, 16])``."""
    block = {0: 18, 1: 20, 2: 34}[fmt]
    rows, row_bytes = blocks.shape
    nb = row_bytes // block
    pad = -rows % 16
    if pad:
        blocks = torch.cat([blocks, blocks.new_zeros(pad, row_bytes)])
    groups = blocks.shape[0] // 16
    b = blocks.reshape(groups, 16, nb, block)
    halves = 2 if fmt == 1 else 1
    scales = (b[..., : 2 * halves].reshape(groups, 16, nb, halves, 2).permute(0, 2, 3, 1, 4).contiguous()
              .view(torch.float16).reshape(groups, nb, halves, 16))
    q = b[..., 2 * halves :]
    if fmt == 2:
        q = q ^ 0x80
    qs = q.reshape(groups, 16, nb, q.shape[-1] // 4, 4).permute(0, 2, 3, 1, 4).contiguous()
    return qs, scales


def ggml_linear(packed: PackedWeight, bias: torch.Tensor | None, portable: bool | None = None,
                vnni: bool | None = None) -> Kernel | None:
    """``F.linear(x, packed.dequantize(), bias)`` for 2-D float32 or bfloat16 x, up to x's per-block int8
    rounding (and a k-quant's rewriting, ``K_QUANTS``); None for a format ``ggml_linear`` does not read.
    ``portable`` forces the plain C++ path, ``vnni`` False the AVX2 one (default: the AVX-512 VNNI kernel on
    repacked blocks where the CPU has it, else AVX2)."""
    fmt = GGML_FORMATS.get(K_QUANTS.get(packed.format, packed.format))
    if fmt is None or packed.in_features % 32:
        return None
    blocks = packed.tensors["blocks"]
    if packed.format == "q4_k":
        blocks = q4_k_as_q4_1(blocks)
    elif packed.format == "q6_k":  # gguf's own q8_0 quantizer, ggml's rounding
        blocks = GGMLWeight.quantized("q8_0", packed.dequantize(torch.float32)).tensors["blocks"]
    return _block_linear(blocks, fmt, bias, portable, vnni)


def q4_k_as_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """q4_K blocks ``[out, in / 256 * 144]`` as q4_1 blocks ``[out, in / 32 * 20]`` holding the same 4-bit values.

    A q4_K block is 256 inputs: float16 ``d`` and ``dmin``, twelve bytes of eight 6-bit scales ``sc`` and mins ``m``
    (ggml's ``get_scale_min_k4`` packing), and 128 bytes whose low nibbles are sub-block ``2j``'s 32 values and high
    nibbles sub-block ``2j + 1``'s, for ``j`` 0-3; value = d * sc * q - dmin * m. A q4_1 block is 32 inputs: float16
    ``d``, float16 ``m``, and 16 bytes whose low nibbles are values 0-15 and high nibbles 16-31; value = d * q + m.
    """
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, 144).to(torch.int32)
    halves = blocks.reshape(rows, -1, 144)[..., :4].contiguous().view(torch.float16).float()  # d, dmin
    d, dmin = halves[..., 0:1], halves[..., 1:2]
    sc_bytes = b[..., 4:16]
    low, high = sc_bytes[..., 0:4], sc_bytes[..., 4:8]
    top = sc_bytes[..., 8:12]
    scale = torch.cat([low & 63, (top & 0xF) | ((low >> 6) << 4)], dim=-1)  # sub-blocks 0-3, 4-7
    mins = torch.cat([high & 63, (top >> 4) | ((high >> 6) << 4)], dim=-1)
    qs = b[..., 16:].reshape(rows, -1, 4, 32)
    values = torch.stack([qs & 0xF, qs >> 4], dim=3).reshape(rows, -1, 8, 32)  # sub-block 2j, then 2j + 1
    out = torch.empty(rows, values.shape[1], 8, 20, dtype=torch.uint8)
    out[..., 0:2] = (d * scale).half().unsqueeze(-1).view(torch.uint8)
    out[..., 2:4] = (-(dmin * mins)).half().unsqueeze(-1).view(torch.uint8)
    out[..., 4:] = (values[..., :16] | (values[..., 16:] << 4)).to(torch.uint8)
    return out.reshape(rows, -1)


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
    if not portable and vnni is not False and has_vnni() and torch.ops.frame_cpu.ggml_repacked_available():
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
    """The AVX-512 VNNI kernel over ``blocks`` repacked once (``repack_blocks``)."""
    op = torch.ops.frame_cpu.ggml_linear_repacked.default
    out_features = blocks.shape[0]
    qs, scales = repack_blocks(blocks.contiguous(), fmt)
    float_bias = None if bias is None else bias.float().contiguous()

    def linear(x: torch.Tensor) -> torch.Tensor | None:
        if x.dim() != 2 or x.dtype not in (torch.float32, torch.bfloat16):
            return None
        return op(x, qs, scales, fmt, out_features, float_bias)

    return linear


def packed_layer_kernel(layer: torch.nn.Module, packed: PackedWeight, gated: bool) -> Kernel | None:
    """The kernel of a linear layer whose weight is ``packed``; ``gated`` for SwiGLU's projection, whose
    ``[gate | up]`` product goes through ``silu(gate) * up`` (the native fused activation for bfloat16)."""
    bias = getattr(layer, "bias", None)
    if packed.format == "int8" and (kernel := w8a8.layer_kernel(packed, bias, gated)) is not None:
        return kernel  # AMX int8 tiles or AVX-512 VNNI, x per token
    linear = int8_linear(packed, bias) if packed.format == "int8" else ggml_linear(packed, bias)
    return kernels.gated(linear) if linear is not None and gated else linear
