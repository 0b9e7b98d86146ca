"""The per-step gather plan of the sdpa backend: which cache slots each sequence reads, and its masks.

Built once per step (in ``prepare``) from the host copies of the metadata, then reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from frame.interfaces.attention import AttentionMetadata


@dataclass
class DecodeGroup:
    """Every single-token sequence of the step, attended in one batched SDPA call.

    ``rows`` are the query rows ``[B]``; ``blocks`` ``[B * N]`` the first ``N`` entries of each sequence's block
    table (padded with block 0), so one ``index_select`` over the pool's block dimension gathers every context
    as ``[B, N * block_size]`` slots, whole blocks at a time; ``mask`` ``[B, 1, 1, N * block_size]`` is True
    where a slot is real. :meth:`bias` is the same mask as an additive bias (SDPA's fast path on CPU).
    """

    rows: torch.Tensor
    blocks: torch.Tensor
    num_blocks: int
    mask: torch.Tensor
    _biases: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """``0`` where the mask is True, ``-inf`` elsewhere, in ``dtype``; built once per step and dtype."""
        bias = self._biases.get(dtype)
        if bias is None:
            bias = self._biases[dtype] = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            bias.masked_fill_(~self.mask, float("-inf"))
        return bias


@dataclass
class PrefillSeq:
    """One sequence with several new tokens: query rows ``start:start+query_len`` over ``slots`` ``[seq_len]``.

    ``mask`` ``[query_len, seq_len]`` is the causal mask shifted by the cached context, or None when the
    sequence has no cached context (then plain ``is_causal`` applies).
    """

    start: int
    query_len: int
    slots: torch.Tensor
    mask: torch.Tensor | None


@dataclass
class SdpaPlan:
    """The decode group (None when no sequence decodes) and the prefill sequences of one step."""

    decode: DecodeGroup | None
    prefills: list[PrefillSeq]


def _slots(block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """Cache slots of positions ``0..length-1`` of a sequence, read through its block table."""
    positions = torch.arange(length, device=block_table.device)
    return block_table[positions // block_size].long() * block_size + positions % block_size


def build_plan(meta: AttentionMetadata) -> SdpaPlan:
    """Split the step into one decode group and per-sequence prefills, with their slots and masks."""
    device = meta.block_tables.device
    starts = [0]
    for q in meta.query_lens:
        starts.append(starts[-1] + q)
    decode_ids = [i for i, q in enumerate(meta.query_lens) if q == 1]
    decode = None
    if decode_ids:
        longest = max(meta.seq_lens_host[i] for i in decode_ids)
        num_blocks = (longest + meta.block_size - 1) // meta.block_size
        index = torch.tensor(decode_ids, device=device)
        lens = meta.seq_lens.to(device).index_select(0, index).long()
        mask = torch.arange(num_blocks * meta.block_size, device=device)[None, :] < lens[:, None]
        blocks = meta.block_tables.index_select(0, index)[:, :num_blocks].long().reshape(-1)
        rows = torch.tensor([starts[i] for i in decode_ids], device=device)
        decode = DecodeGroup(rows, blocks, num_blocks, mask[:, None, None, :])
    prefills = []
    for i, (q, s) in enumerate(zip(meta.query_lens, meta.seq_lens_host, strict=True)):
        if q <= 1:
            continue
        context = s - q
        mask = None
        if context:
            query_pos = torch.arange(context, s, device=device)
            mask = torch.arange(s, device=device)[None, :] <= query_pos[:, None]
        prefills.append(PrefillSeq(starts[i], q, _slots(meta.block_tables[i], s, meta.block_size), mask))
    return SdpaPlan(decode, prefills)
