"""The repacked layout of ggml weights that ``csrc/ggml_linear.cpp``'s ``ggml_linear_repacked`` reads: output rows in
groups of 16, one per vector lane, each block of 32 of a group as ``[quads][16 rows][4 bytes]`` (``repack_blocks``),
the K-quants' and iq4_xs's super-blocks as 8 such blocks and one record of scales (``repack_q4_k``, ...), and
groups in sets of four whose blocks interleave, so that a one-row product reads a set as one stream
(``_interleave_sets``). A large weight is repacked a slice of rows at a time (``repack_by_rows``)."""

from __future__ import annotations

import torch

#: ggml formats ``ggml_linear`` reads, with the number its ``format`` argument takes.
GGML_FORMATS = {"q4_0": 0, "q4_1": 1, "q8_0": 2, "q5_0": 3, "q5_1": 4, "iq4_nl": 5}
#: Bytes of one block of 32 in each of them.
BLOCK_BYTES = {0: 18, 1: 20, 2: 34, 3: 22, 4: 24, 5: 18}
#: Super-block formats ``ggml_linear_repacked`` also reads (with AVX-512 VNNI), each chunk of 32 as a block.
REPACKED_KQUANTS = {"q4_k": 6, "q6_k": 7, "q5_k": 8, "q3_k": 9, "q2_k": 10, "iq4_xs": 11}

#: Groups of 16 output rows whose blocks the repacked layout interleaves, so that a one-row product reads them
#: in step as one stream (``csrc/ggml_linear.cpp``'s kSetGroups).
SET_GROUPS = 4


def repack_q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q4_K super-blocks ``[out, in / 256 * 144]`` in ``ggml_linear_repacked``'s layout (format 6): each chunk of 32
    values as q4_0's repacked nibbles (byte i: value i low, value i + 16 high), and per group and super-block one
    scale record of 160 float16 slots: per chunk its 16 rows' 6-bit sc bytes then mn bytes (256 bytes), then the
    rows' float16 d and dmin. Returns ``(qs uint8 [groups, in / 32, 4, 16, 4], scales float16 [groups, in / 256,
    10, 16])``, set by set as ``repack_blocks``'s. The values are ggml's ``dequantize_row_q4_K``: chunk c of a
    super-block is d sc_c q - dmin mn_c, q the nibbles of bytes 32 (c // 2).. (low for even c, high for odd)."""
    return _repack_k_with_mins(blocks, 144, high_bits=False)


def repack_q5_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q5_K super-blocks ``[out, in / 256 * 176]`` as ``repack_q4_k`` lays out q4_K (format 8), each chunk's 5-bit
    values as q5_0's repacked nibbles and mask of high bits: ``(qs uint8 [groups, in / 32, 5, 16, 4], scales)``.
    ggml's ``dequantize_row_q5_K``: value l of chunk c is q4_K's nibble plus 16 times bit c of qh byte l."""
    return _repack_k_with_mins(blocks, 176, high_bits=True)


def _repack_k_with_mins(blocks: torch.Tensor, size: int, high_bits: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """q4_K (``high_bits`` False) or q5_K: d, dmin, 12 bytes of 6-bit sc and mn, q5_K's 32 bytes of high bits, then
    128 bytes of nibbles."""
    groups, b = _super_blocks(blocks, size)
    padded, nsb = b.shape[0], b.shape[1]
    q = b[..., 4:16].int()  # ggml's get_scale_min_k4: eight 6-bit scales and mins in 12 bytes
    sc = torch.cat([q[..., 0:4] & 63, (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)], dim=-1)
    mn = torch.cat([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], dim=-1)
    nibbles = b[..., size - 128 :].reshape(padded, nsb, 4, 32)
    values = torch.stack([nibbles & 0xF, nibbles >> 4], dim=3).reshape(padded, nsb * 8, 32)  # chunk 2j + high
    block = torch.zeros(padded, nsb * 8, 22 if high_bits else 18, dtype=torch.uint8)  # as q5_0 or q4_0 blocks
    block[..., -16:] = values[..., :16] | (values[..., 16:] << 4)
    if high_bits:  # bit c of qh byte l: chunk c's value l's bit 4, as q5_0's little-endian uint32 of high bits
        qh = b[..., 16:48].long()  # [rows, nsb, l]
        bits = (qh.unsqueeze(2) >> torch.arange(8).reshape(1, 1, 8, 1)) & 1  # [rows, nsb, chunk, l]
        masks = (bits << torch.arange(32)).sum(-1).reshape(padded, nsb * 8)
        block[..., 2:6] = (masks.unsqueeze(-1) >> torch.arange(0, 32, 8)).to(torch.uint8)
    qs, _ = repack_blocks(block.reshape(padded, -1), GGML_FORMATS["q5_0" if high_bits else "q4_0"])
    record = torch.empty(groups, nsb, 320, dtype=torch.uint8)
    by_chunk = torch.stack([sc, mn], dim=-1).to(torch.uint8)  # [rows, nsb, 8 chunks, sc / mn]
    record[..., :256] = by_chunk.reshape(groups, 16, nsb, 8, 2).permute(0, 2, 3, 4, 1).reshape(groups, nsb, 256)
    halves = b[..., :4].reshape(groups, 16, nsb, 2, 2).permute(0, 2, 3, 1, 4)  # [groups, nsb, d / dmin, row, 2]
    record[..., 256:] = halves.reshape(groups, nsb, 64)
    return qs, _interleave_sets(record.view(torch.float16).reshape(groups, nsb, 10, 16))


def repack_q6_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q6_K super-blocks ``[out, in / 256 * 210]`` in ``ggml_linear_repacked``'s layout (format 7): each chunk of 32
    of 6-bit values u as q5_0's repacked nibbles and mask of bit 4, then a sixth chunk, the masks of bit 5; per group
    and super-block one record of 144 float16 slots: per chunk of 16 inputs its 16 rows' int8 sc (256 bytes), then
    the rows' float16 d. Returns ``(qs uint8 [groups, in / 32, 6, 16, 4], scales float16 [groups, in / 256, 9,
    16])``, set by set. The values are ggml's ``dequantize_row_q6_K``: input v of a super-block is d sc_(v // 16)
    (u - 32), u from ql's nibble and qh's two bits."""
    groups, b = _super_blocks(blocks, 210)
    padded, nsb = b.shape[0], b.shape[1]
    ql, qh = b[..., :128].reshape(padded, nsb, 2, 2, 32), b[..., 128:192].reshape(padded, nsb, 2, 32)
    # Input 128 n + 32 k + l: ql's byte l (k even) or l + 32 (k odd) of half n, low nibble for k < 2; qh's bits 2k.
    low = torch.stack([ql[:, :, :, 0] & 0xF, ql[:, :, :, 1] & 0xF, ql[:, :, :, 0] >> 4, ql[:, :, :, 1] >> 4], dim=3)
    high = torch.stack([(qh >> (2 * k)) & 3 for k in range(4)], dim=3)
    values = (low | (high << 4)).reshape(padded, nsb * 8, 32)
    bit = torch.arange(32, dtype=torch.int64)
    parts = []
    for plane in (4, 5):  # as q5_0 blocks: the nibbles and this plane's bits as the high bits
        as_q5_0 = torch.zeros(padded, nsb * 8, 22, dtype=torch.uint8)
        masks = (((values >> plane) & 1).long() << bit).sum(-1)  # [rows, blocks]: bit i of input i
        as_q5_0[..., 2:6] = (masks.unsqueeze(-1) >> torch.arange(0, 32, 8)).to(torch.uint8)
        as_q5_0[..., 6:] = (values[..., :16] & 0xF) | ((values[..., 16:] & 0xF) << 4)
        parts.append(_group_major(as_q5_0.reshape(padded, -1), GGML_FORMATS["q5_0"])[0])
    qs = torch.cat([parts[0], parts[1][:, :, 4:5]], dim=2)
    record = torch.empty(groups, nsb, 288, dtype=torch.uint8)
    sc = b[..., 192:208].reshape(groups, 16, nsb, 16).permute(0, 2, 3, 1)  # [groups, nsb, chunk, row]
    record[..., :256] = sc.reshape(groups, nsb, 256)
    record[..., 256:] = b[..., 208:210].reshape(groups, 16, nsb, 2).permute(0, 2, 1, 3).reshape(groups, nsb, 32)
    return _interleave_sets(qs.contiguous()), _interleave_sets(record.view(torch.float16).reshape(groups, nsb, 9, 16))


def repack_q3_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q3_K super-blocks ``[out, in / 256 * 110]`` in ``ggml_linear_repacked``'s layout (format 9): each chunk of 32 of
    3-bit values u as two chunks of their low two bits, four to a byte (chunk c's bits 2p..2p+1 of row j's byte t:
    input 4 (4c + p) + t), and a third of q5_0's masks of bit 2; per group and super-block q6_K's record of 144
    float16 slots (per chunk of 16 inputs its 16 rows' int8 sc, then the rows' float16 d). Returns ``(qs uint8
    [groups, in / 32, 3, 16, 4], scales float16 [groups, in / 256, 9, 16])``, set by set: 1.04x the file's bytes.
    The values are ggml's ``dequantize_row_q3_K``: input v of a super-block is d sc_(v // 16) (u - 4), u the two
    bits of qs and hmask's bit."""
    groups, b = _super_blocks(blocks, 110)
    padded, nsb = b.shape[0], b.shape[1]
    # Input 128 n + 32 j + l: hmask byte l's bit 4 n + j.
    hmask = b[..., :32].reshape(padded, nsb, 1, 1, 32).int()
    high = (hmask >> (4 * torch.arange(2).reshape(1, 1, 2, 1, 1) + torch.arange(4).reshape(1, 1, 1, 4, 1))) & 1
    qs = _crumbs(b[..., 32:96], groups, high.reshape(padded, nsb * 8, 32))
    # ggml's 16 scales of 6 bits: chunk s's low four bits in byte s % 8 (high nibble for s >= 8), its high two in
    # byte 8 + s % 4 at bits 2 (s // 4).
    raw = b[..., 96:108].int()
    s_index = torch.arange(16)
    sc = (((raw[..., s_index % 8] >> (4 * (s_index // 8))) & 0xF)
          | (((raw[..., 8 + s_index % 4] >> (2 * (s_index // 4))) & 3) << 4)) - 32  # [rows, nsb, chunk]
    record = torch.empty(groups, nsb, 288, dtype=torch.uint8)
    record[..., :256] = sc.to(torch.int8).view(torch.uint8).reshape(groups, 16, nsb, 16).permute(0, 2, 3, 1) \
        .reshape(groups, nsb, 256)
    record[..., 256:] = b[..., 108:110].reshape(groups, 16, nsb, 2).permute(0, 2, 1, 3).reshape(groups, nsb, 32)
    return _interleave_sets(qs), _interleave_sets(record.view(torch.float16).reshape(groups, nsb, 9, 16))


def repack_q2_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q2_K super-blocks ``[out, in / 256 * 84]`` in ``ggml_linear_repacked``'s layout (format 10): each chunk of 32
    of 2-bit values u as ``repack_q3_k``'s two chunks of them, four to a byte; per group and super-block q4_K's record
    of 160 float16 slots: per chunk of 16 inputs its 16 rows' byte of ggml's 4-bit sc (low nibble) and mn (high),
    then the rows' float16 d and dmin. Returns ``(qs uint8 [groups, in / 32, 2, 16, 4], scales float16 [groups,
    in / 256, 10, 16])``, set by set: the file's bytes. The values are ggml's ``dequantize_row_q2_K``: input v of a
    super-block is d sc_(v // 16) u - dmin mn_(v // 16)."""
    groups, b = _super_blocks(blocks, 84)
    nsb = b.shape[1]
    qs, record = _crumbs(b[..., 16:80], groups), torch.empty(groups, nsb, 320, dtype=torch.uint8)
    record[..., :256] = b[..., :16].reshape(groups, 16, nsb, 16).permute(0, 2, 3, 1).reshape(groups, nsb, 256)
    halves = b[..., 80:84].reshape(groups, 16, nsb, 2, 2).permute(0, 2, 3, 1, 4)  # [groups, nsb, d / dmin, row, 2]
    record[..., 256:] = halves.reshape(groups, nsb, 64)
    return _interleave_sets(qs), _interleave_sets(record.view(torch.float16).reshape(groups, nsb, 10, 16))


def repack_iq4_xs(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """iq4_xs super-blocks ``[out, in / 256 * 136]`` in ``ggml_linear_repacked``'s layout (format 11): each chunk of 32
    as iq4_nl's repacked nibbles (byte i: value i low, value i + 16 high, as the file has them); per group and
    super-block one record of 80 float16 slots: per chunk its 16 rows' int8 sc (the 6-bit scale - 32), then the rows'
    float16 d. Returns ``(qs uint8 [groups, in / 32, 4, 16, 4], scales float16 [groups, in / 256, 5, 16])``, set by
    set: 1.04x the file's bytes. The values are ggml's ``dequantize_row_iq4_xs``: chunk c of a super-block is
    d sc_c kvalues_iq4nl[nibble]."""
    groups, b = _super_blocks(blocks, 136)
    padded, nsb = b.shape[0], b.shape[1]
    block = torch.zeros(padded, nsb * 8, 18, dtype=torch.uint8)  # as iq4_nl blocks, d left 0 (the record has it)
    block[..., 2:] = b[..., 8:].reshape(padded, nsb * 8, 16)
    qs, _ = _group_major(block.reshape(padded, -1), GGML_FORMATS["iq4_nl"])
    # ggml's eight 6-bit scales: chunk c's low four bits the nibble c % 2 of byte 4 + c // 2, its high two bits 2c
    # of the uint16 at byte 2.
    chunk = torch.arange(8)
    high = b[..., 2].int() | (b[..., 3].int() << 8)
    low = (b[..., 4 + chunk // 2].int() >> (4 * (chunk % 2))) & 0xF
    sc = (low | (((high.unsqueeze(-1) >> (2 * chunk)) & 3) << 4)) - 32  # [rows, nsb, chunk]
    record = torch.empty(groups, nsb, 160, dtype=torch.uint8)
    record[..., :128] = sc.to(torch.int8).view(torch.uint8).reshape(groups, 16, nsb, 8).permute(0, 2, 3, 1) \
        .reshape(groups, nsb, 128)
    record[..., 128:] = b[..., :2].reshape(groups, 16, nsb, 2).permute(0, 2, 1, 3).reshape(groups, nsb, 32)
    return _interleave_sets(qs), _interleave_sets(record.view(torch.float16).reshape(groups, nsb, 5, 16))


def _super_blocks(blocks: torch.Tensor, size: int) -> tuple[int, torch.Tensor]:
    """``blocks`` ``[rows, nsb * size]`` padded with zero rows to whole groups of 16: ``(groups, [rows, nsb, size])``"""
    pad = -blocks.shape[0] % 16
    if pad:
        blocks = torch.cat([blocks, blocks.new_zeros(pad, blocks.shape[1])])
    return blocks.shape[0] // 16, blocks.reshape(blocks.shape[0], -1, size)


def _crumbs(qs_bytes: torch.Tensor, groups: int, high: torch.Tensor | None = None) -> torch.Tensor:
    """ggml's 64 bytes of 2-bit values per super-block ``[rows, nsb, 64]`` (input 128 n + 32 j + l: bits 2j..2j+1 of
    byte 32 n + l) as the repacked chunks ``[groups, nsb * 8, 2 (+ 1), 16, 4]``: chunk c's byte t of row j holds
    inputs 4 (4c + p) + t at bits 2p; with ``high`` (q3_K's bit 2 of each input, ``[rows, nsb * 8, 32]``) a third
    chunk of q5_0's masks of it."""
    padded, nsb = qs_bytes.shape[0], qs_bytes.shape[1]
    j = torch.arange(4).reshape(1, 1, 1, 4, 1)
    u = ((qs_bytes.reshape(padded, nsb, 2, 1, 32).int() >> (2 * j)) & 3).reshape(padded, nsb * 8, 2, 4, 4)
    packed = (u << (2 * torch.arange(4).reshape(1, 1, 1, 4, 1))).sum(3)  # [rows, block, c, t]
    out = torch.empty(groups, nsb * 8, 2 if high is None else 3, 16, 4, dtype=torch.uint8)
    out[:, :, :2] = packed.reshape(groups, 16, nsb * 8, 2, 4).permute(0, 2, 3, 1, 4).to(torch.uint8)
    if high is not None:
        bits = high.long().reshape(groups, 16, nsb * 8, 8, 4)  # [group, row j, block, mask i, t]
        masks = (bits.permute(0, 2, 3, 1, 4).reshape(groups, nsb * 8, 8, 64) << torch.arange(64)).sum(-1)
        out[:, :, 2] = masks.contiguous().view(torch.uint8).reshape(groups, nsb * 8, 16, 4)
    return out


def repack_blocks(blocks: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml blocks ``[out, in / 32 * block bytes]`` in ``ggml_linear_repacked``'s layout: output rows in groups of
    16 (the last padded with zero rows), per group and block the values as ``[quads][16 rows][4 bytes]`` (q4_0 /
    q4_1 / iq4_nl: ggml's 16 nibble bytes, 4 chunks; q8_0: its 32 bytes XOR 0x80, i.e. q + 128 unsigned, 8 chunks;
    q5_0 / q5_1: the nibbles' 4 chunks and a fifth of 8 little-endian 64-bit masks, mask i's bit 4 j + t the high
    bit of row j's input 4 i + t) and the 16 rows' float16 scales (d, then m for q4_1 / q5_1). Returns ``(qs uint8
    [groups, blocks, quads, 16, 4], scales float16 [groups, blocks, 1 or 2, 16])``, each stored set by set
    (``_interleave_sets``: the groups' blocks side by side) in a tensor of that shape."""
    qs, scales = _group_major(blocks, fmt)
    return _interleave_sets(qs), _interleave_sets(scales)


def _group_major(blocks: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``repack_blocks``'s tensors before the sets interleave: each group's blocks in turn."""
    block = BLOCK_BYTES[fmt]
    rows, row_bytes = blocks.shape
    nb = row_bytes // block
    pad = -rows % 16
    if pad:
        blocks = torch.cat([blocks, blocks.new_zeros(pad, row_bytes)])
    groups = blocks.shape[0] // 16
    b = blocks.reshape(groups, 16, nb, block)
    halves = 2 if fmt in (1, 4) else 1
    scales = (b[..., : 2 * halves].reshape(groups, 16, nb, halves, 2).permute(0, 2, 3, 1, 4).contiguous()
              .view(torch.float16).reshape(groups, nb, halves, 16))
    q = b[..., 2 * halves :]
    if fmt == 2:
        q = q ^ 0x80
    high = None
    if fmt in (3, 4):  # the uint32 of high bits, then the nibbles
        high, q = q[..., :4], q[..., 4:]
    qs = q.reshape(groups, 16, nb, q.shape[-1] // 4, 4).permute(0, 2, 3, 1, 4)
    if high is not None:
        bits = (high.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1  # [groups, 16, nb, 4, 8]: bit i
        bits = bits.reshape(groups, 16, nb, 8, 4).permute(0, 2, 3, 1, 4)  # [groups, nb, mask i, row j, t]
        masks = (bits.reshape(groups, nb, 8, 8, 8).int() << torch.arange(8)).sum(-1).to(torch.uint8)
        qs = torch.cat([qs, masks.reshape(groups, nb, 1, 16, 4)], dim=2)
    return qs.contiguous(), scales


def _interleave_sets(t: torch.Tensor) -> torch.Tensor:
    """``t`` [groups, blocks, ...] with each set of SET_GROUPS consecutive groups (the last set may have fewer)
    stored block-major: block 0 of each of its groups, then block 1. The set keeps the bytes its groups held, so
    group g's blocks begin in the same set as before and lie one block row (its set's groups) apart."""
    groups, full = t.shape[0], t.shape[0] // SET_GROUPS * SET_GROUPS
    parts = [t[:full].reshape(full // SET_GROUPS, SET_GROUPS, *t.shape[1:]).transpose(1, 2).reshape(-1)]
    if full < groups:
        parts.append(t[full:].transpose(0, 1).reshape(-1))
    return torch.cat(parts).reshape(t.shape)


#: The packer of each super-block format, by its number in REPACKED_KQUANTS.
_SUPER_BLOCK_PACKERS = {6: repack_q4_k, 7: repack_q6_k, 8: repack_q5_k, 9: repack_q3_k, 10: repack_q2_k,
                        11: repack_iq4_xs}
#: Rows repacked at a time, a multiple of a set's 64: a large weight's repack makes a few times its size in
#: temporaries, which (freed or not given back at once) raised a 1B Q4_K_M file's peak while loading by 0.8 GiB.
_REPACK_ROWS = 1024


def repack_by_rows(blocks: torch.Tensor, fmt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``repack_blocks`` (the super-block formats' ``repack_q4_k``, ...) of ``blocks``, _REPACK_ROWS rows at a time
    into the whole weight's tensors: every set lies in one slice, and a slice's tensors are whole groups, so the
    slices' bytes laid end to end are the whole weight's."""
    repack = _SUPER_BLOCK_PACKERS.get(fmt, lambda b: repack_blocks(b, fmt))
    rows = blocks.shape[0]
    if rows <= _REPACK_ROWS:
        return repack(blocks)
    out: tuple[torch.Tensor, torch.Tensor] | None = None
    for first in range(0, rows, _REPACK_ROWS):
        qs, scales = repack(blocks[first : first + _REPACK_ROWS])
        if out is None:
            groups = -(-rows // 16)
            out = (qs.new_empty(groups, *qs.shape[1:]), scales.new_empty(groups, *scales.shape[1:]))
        group = first // 16
        out[0][group : group + qs.shape[0]] = qs
        out[1][group : group + scales.shape[0]] = scales
    assert out is not None
    return out
