"""ggml formats of 256-value super-blocks rewritten once at load into blocks of 32 that ``ggml_linear`` reads.

Each row is rewritten in torch, vectorised, from the file's bytes; gguf's own dequantisation stays the reference.
What each costs, in bytes per 256 weights (file -> memory) and in accuracy:

============  ==========  ==================  =========================================================================
format        becomes     bytes / 256         values
============  ==========  ==================  =========================================================================
q4_K          q4_1        144 -> 160 (1.11x)  the same nibbles; d * sc and -dmin * m rounded to float16 (2^-11 rel.)
q5_K          q5_1        176 -> 192 (1.09x)  the same 5-bit values; d * sc and -dmin * m rounded to float16
iq4_xs        iq4_nl      136 -> 144 (1.06x)  the same codebook indices; d * (ls - 32) rounded to float16
q6_K          q8_0        210 -> 272 (1.30x)  requantized to 8 bits per 32 (gguf's q8_0): within half an 8-bit step
q3_K          q8_0        110 -> 272 (2.47x)  as q6_K
q2_K          q8_0         84 -> 272 (3.24x)  as q6_K
============  ==========  ==================  =========================================================================

The first three stay within a tenth of the file; q3_K and q2_K grow two and a half to three times, so a Q2_K or
Q3_K_M file's resident memory is well above its size (native kernels for their 16-value sub-blocks would fix it).
A float16 scale below 2^-14 is subnormal and keeps fewer bits, as ggml's own float16 scales do.
"""

from __future__ import annotations

import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights import GGMLWeight

#: Format rewritten -> the block format ``ggml_linear`` reads it as.
REWRITTEN_AS: dict[str, str] = {"q4_k": "q4_1", "q5_k": "q5_1", "iq4_xs": "iq4_nl",
                                "q6_k": "q8_0", "q3_k": "q8_0", "q2_k": "q8_0"}


def rewrite(packed: PackedWeight) -> torch.Tensor:
    """``packed``'s blocks in ``REWRITTEN_AS[packed.format]``, ``[out, in / 32 * block bytes]``."""
    blocks = packed.tensors["blocks"]
    if packed.format == "q4_k":
        return q4_k_as_q4_1(blocks)
    if packed.format == "q5_k":
        return q5_k_as_q5_1(blocks)
    if packed.format == "iq4_xs":
        return iq4_xs_as_iq4_nl(blocks)
    # gguf's own q8_0 quantizer, ggml's rounding
    return GGMLWeight.quantized("q8_0", packed.dequantize(torch.float32)).tensors["blocks"]


def _halves(blocks: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """``count`` float16 values at byte ``start`` of each block of ``blocks`` ``[rows, n, bytes]``, as float32."""
    return blocks[..., start : start + 2 * count].contiguous().view(torch.float16).float()


def _k_scales(sc_bytes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q4_K / q5_K's eight 6-bit scales and mins from their 12 bytes (ggml's ``get_scale_min_k4``)."""
    low, high, top = sc_bytes[..., 0:4], sc_bytes[..., 4:8], sc_bytes[..., 8:12]
    scale = torch.cat([low & 63, (top & 0xF) | ((low >> 6) << 4)], dim=-1)  # sub-blocks 0-3, 4-7
    mins = torch.cat([high & 63, (top >> 4) | ((high >> 6) << 4)], dim=-1)
    return scale, mins


def _sub_block_scales(raw: torch.Tensor, out_bytes: int) -> torch.Tensor:
    """q4_1 / q5_1 blocks ``[rows, n, 8, out_bytes]`` for q4_K / q5_K super-blocks ``raw`` ``[rows, n, bytes]``, all
    but their first 4 bytes left to fill: each sub-block's d * sc and -dmin * m rounded to float16."""
    halves = _halves(raw, 0, 2)
    scale, mins = _k_scales(raw[..., 4:16].to(torch.int32))
    out = torch.empty(*raw.shape[:2], 8, out_bytes, dtype=torch.uint8)
    out[..., 0:2] = (halves[..., 0:1] * scale).half().unsqueeze(-1).view(torch.uint8)
    out[..., 2:4] = (-(halves[..., 1:2] * mins)).half().unsqueeze(-1).view(torch.uint8)
    return out


def _nibble_pairs(values: torch.Tensor) -> torch.Tensor:
    """32 values a block (low 4 bits each) as ggml's 16 bytes: low nibbles values 0-15, high nibbles 16-31."""
    return ((values[..., :16] & 0xF) | ((values[..., 16:] & 0xF) << 4)).to(torch.uint8)


def q4_k_as_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """q4_K blocks ``[out, in / 256 * 144]`` as q4_1 blocks ``[out, in / 32 * 20]`` holding the same 4-bit values.

    A q4_K block is 256 inputs: float16 ``d`` and ``dmin``, twelve bytes of eight 6-bit scales ``sc`` and mins ``m``
    (ggml's ``get_scale_min_k4`` packing), and 128 bytes whose low nibbles are sub-block ``2j``'s 32 values and high
    nibbles sub-block ``2j + 1``'s, for ``j`` 0-3; value = d * sc * q - dmin * m. A q4_1 block is 32 inputs: float16
    ``d``, float16 ``m``, and 16 bytes whose low nibbles are values 0-15 and high nibbles 16-31; value = d * q + m.
    """
    rows = blocks.shape[0]
    raw = blocks.reshape(rows, -1, 144)
    qs = raw[..., 16:].to(torch.int32).reshape(rows, -1, 4, 32)
    values = torch.stack([qs & 0xF, qs >> 4], dim=3).reshape(rows, -1, 8, 32)  # sub-block 2j, then 2j + 1
    out = _sub_block_scales(raw, 20)
    out[..., 4:] = _nibble_pairs(values)
    return out.reshape(rows, -1)


def q5_k_as_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    """q5_K blocks ``[out, in / 256 * 176]`` as q5_1 blocks ``[out, in / 32 * 24]`` holding the same 5-bit values.

    A q5_K block is q4_K's (``d``, ``dmin``, 12 bytes of scales and mins) with 32 bytes ``qh`` before the 128 of
    nibbles: bit ``s`` of ``qh[l]`` is the fifth bit of sub-block ``s``'s value ``l``. A q5_1 block is float16 ``d``,
    float16 ``m``, a little-endian uint32 whose bit ``i`` is value ``i``'s fifth bit, and 16 bytes of nibbles as
    q4_1's; value = d * q + m.
    """
    rows = blocks.shape[0]
    raw = blocks.reshape(rows, -1, 176)
    b = raw.to(torch.int32)
    qs = b[..., 48:].reshape(rows, -1, 4, 32)
    low = torch.stack([qs & 0xF, qs >> 4], dim=3).reshape(rows, -1, 8, 32)
    high = (b[..., 16:48].unsqueeze(2) >> torch.arange(8).view(1, 1, 8, 1)) & 1  # [rows, n, sub-block, value]
    out = _sub_block_scales(raw, 24)
    weights = 1 << torch.arange(8)
    out[..., 4:8] = (high.reshape(rows, -1, 8, 4, 8) * weights).sum(-1).to(torch.uint8)
    out[..., 8:] = _nibble_pairs(low)
    return out.reshape(rows, -1)


def iq4_xs_as_iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    """iq4_xs blocks ``[out, in / 256 * 136]`` as iq4_nl blocks ``[out, in / 32 * 18]`` with the same indices.

    An iq4_xs block is float16 ``d``, a uint16 of the eight sub-blocks' high scale bits (2 each), 4 bytes of their
    low 4 bits (sub-block ``2j`` in byte ``j``'s low nibble, ``2j + 1`` in its high), and 128 bytes: 16 a sub-block,
    nibbles as iq4_nl's; value = d * (ls - 32) * kvalues_iq4nl[nibble]. An iq4_nl block is float16 ``d`` and those
    16 bytes; value = d * kvalues_iq4nl[nibble].
    """
    rows = blocks.shape[0]
    raw = blocks.reshape(rows, -1, 136)
    b = raw.to(torch.int32)
    d = _halves(raw, 0, 1)
    scales_h = b[..., 2:3] | (b[..., 3:4] << 8)
    scales_l = b[..., 4:8]
    low = torch.stack([scales_l & 0xF, scales_l >> 4], dim=-1).reshape(rows, -1, 8)
    ls = low | (((scales_h >> (2 * torch.arange(8))) & 3) << 4)
    out = torch.empty(rows, raw.shape[1], 8, 18, dtype=torch.uint8)
    out[..., 0:2] = (d * (ls - 32)).half().unsqueeze(-1).view(torch.uint8)
    out[..., 2:] = raw[..., 8:].reshape(rows, -1, 8, 16)
    return out.reshape(rows, -1)
