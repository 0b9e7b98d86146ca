"""The per-step gather plan of the sdpa backend: which cache slots each sequence reads, and its masks.

Built once per step (in ``build_metadata``) from the host copies of the metadata, then reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import torch
from frame.interfaces.attention import AttentionMetadata

#: Decode sequences are sorted by length and cut into buckets of at least this many, each padded only to its
#: own longest context: less padding to gather and multiply, at the price of one more call per bucket.
MIN_BUCKET = 16


@dataclass
class DecodeGroup:
    """Single-token sequences of similar length, attended together in one batched call.

    ``rows`` are the query rows ``[B]``; ``blocks`` ``[B * N]`` the first ``N`` entries of each sequence's block
    table (padded with block 0), so one ``index_select`` over the pool's block dimension gathers every context
    as ``[B, N * block_size]`` slots, whole blocks at a time; ``mask`` ``[B, 1, N * block_size]`` is True
    where a slot is real, ``lens`` ``[B, 1, 1]`` each context's length. :meth:`bias` is the mask as an additive
    bias, narrowed to the last ``window`` positions for a sliding-window layer.
    """

    rows: torch.Tensor
    blocks: torch.Tensor
    num_blocks: int
    mask: torch.Tensor
    lens: torch.Tensor
    _biases: dict[tuple[torch.dtype, int | None], torch.Tensor] = field(default_factory=dict)
    _hidden: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def bias(self, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
        """``0`` where a slot is visible, ``-inf`` elsewhere, in ``dtype``; built once per step, dtype and window."""
        bias = self._biases.get((dtype, window))
        if bias is None:
            bias = self._biases[(dtype, window)] = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            bias.masked_fill_(self.hidden(window), float("-inf"))
        return bias

    def hidden(self, window: int | None = None) -> torch.Tensor:
        """``[B, 1, N * block_size]``: True where the decoded token does not see a slot (padding, or outside
        ``window``); built once per step and window."""
        hidden = self._hidden.get(window)
        if hidden is None:
            visible = self.mask
            if window is not None:  # the decoded token sits at position len - 1 and sees (len - 1 - window, len - 1]
                positions = torch.arange(self.mask.shape[-1], device=self.mask.device)
                visible = visible & (positions >= self.lens - window)
            hidden = self._hidden[window] = ~visible
        return hidden

    def clear_padding(self, gathered: torch.Tensor) -> torch.Tensor:
        """Zero the padding slots of a gathered context ``[B, N * block_size, width]`` in place and return it.

        Those slots were never written for this sequence: the pool is ``torch.empty``, so they may hold NaN or
        infinity, and a zero probability times NaN is NaN."""
        return gathered.masked_fill_(~self.mask.transpose(1, 2), 0)


@dataclass
class PrefillSeq:
    """One sequence with several new tokens: query rows ``start:start+query_len`` over ``slots`` ``[seq_len]``.

    ``mask`` ``[query_len, seq_len]`` is the causal mask shifted by the cached context, or None when the
    sequence has no cached context (then plain ``is_causal`` applies). :meth:`visible` is the mask for a layer with
    a sliding window (or any mask at all, for a layer that cannot use ``is_causal``).
    """

    start: int
    query_len: int
    slots: torch.Tensor
    mask: torch.Tensor | None
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def visible(self, window: int | None) -> torch.Tensor:
        """``[query_len, seq_len]``: True where a query sees a key (causal, and inside ``window`` when given)."""
        found = self._masks.get(window)
        if found is None:
            seq_len = self.slots.shape[0]
            keys = torch.arange(seq_len, device=self.slots.device)[None, :]
            queries = torch.arange(seq_len - self.query_len, seq_len, device=self.slots.device)[:, None]
            found = keys <= queries
            if window is not None:
                found &= keys > queries - window
            self._masks[window] = found
        return found


@dataclass
class SdpaPlan:
    """The decode groups (empty when no sequence decodes) and the prefill sequences of one step."""

    decodes: list[DecodeGroup]
    prefills: list[PrefillSeq]


def _slots(block_table: torch.Tensor, length: int, block_size: int) -> torch.Tensor:
    """Cache slots of positions ``0..length-1`` of a sequence, read through its block table."""
    positions = torch.arange(length, device=block_table.device)
    return block_table[positions // block_size].long() * block_size + positions % block_size


def _decode_group(meta: AttentionMetadata, ids: list[int], starts: list[int]) -> DecodeGroup:
    """One group over the decode sequences ``ids``, padded to the longest of them."""
    device = meta.block_tables.device
    longest = max(meta.seq_lens_host[i] for i in ids)
    num_blocks = (longest + meta.block_size - 1) // meta.block_size
    index = torch.tensor(ids, device=device)
    lens = torch.tensor([meta.seq_lens_host[i] for i in ids], device=device)
    mask = torch.arange(num_blocks * meta.block_size, device=device)[None, :] < lens[:, None]
    blocks = meta.block_tables.index_select(0, index)[:, :num_blocks].long().reshape(-1)
    rows = torch.tensor([starts[i] for i in ids], device=device)
    return DecodeGroup(rows, blocks, num_blocks, mask[:, None, :], lens[:, None, None])


def _buckets(meta: AttentionMetadata, decode_ids: list[int]) -> list[list[int]]:
    """Decode sequences sorted by length (longest first), in contiguous runs of ``MIN_BUCKET`` or more."""
    ordered = sorted(decode_ids, key=lambda i: -meta.seq_lens_host[i])
    count = max(1, len(ordered) // MIN_BUCKET)
    bounds = [round(j * len(ordered) / count) for j in range(count + 1)]
    return [ordered[a:b] for a, b in pairwise(bounds)]


def build_plan(meta: AttentionMetadata) -> SdpaPlan:
    """Split the step into length-bucketed decode groups and per-sequence prefills, with slots and masks."""
    device = meta.block_tables.device
    starts = [0]
    for q in meta.query_lens:
        starts.append(starts[-1] + q)
    decode_ids = [i for i, q in enumerate(meta.query_lens) if q == 1]
    decodes = [_decode_group(meta, ids, starts) for ids in _buckets(meta, decode_ids)] if decode_ids else []
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
    return SdpaPlan(decodes, prefills)
