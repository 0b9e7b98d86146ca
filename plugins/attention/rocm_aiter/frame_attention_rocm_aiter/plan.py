"""The per-step conversion of frame's metadata into the arguments AITER's kernels take.

AITER splits the work the way vLLM's ROCm backends do: decodes (one new token) go to its paged attention
kernel, which reads frame's ``[num_blocks, block_size, num_kv_heads, head_dim]`` caches directly (the "NHD"
layout) through the block tables; prefills and prefill chunks go to its varlen flash attention, which takes
keys and values contiguous per sequence, so their whole context is gathered out of the pool by slot. Every
index is built from the host copies of the lengths, so planning never waits on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
from frame.interfaces.attention import AttentionMetadata


@dataclass(frozen=True)
class DecodePart:
    """The decodes of a step: one query row per sequence, attended by ``aiter.paged_attention_v1``."""

    rows: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_query_lens: torch.Tensor
    max_context_len: int
    all_rows: bool

    @property
    def num_seqs(self) -> int:
        return int(self.context_lens.shape[0])


@dataclass(frozen=True)
class PrefillPart:
    """The prefills and chunks of a step, attended by ``aiter.flash_attn_varlen_func`` over gathered KV."""

    rows: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    kv_slots: torch.Tensor
    all_rows: bool


@dataclass(frozen=True)
class AiterPlan:
    """A step cut into its decode part and its prefill part (either may be None)."""

    decode: DecodePart | None
    prefill: PrefillPart | None


def _int32(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)


def _int64(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def build_plan(meta: AttentionMetadata) -> AiterPlan:
    """Split ``meta``'s sequences into decodes and prefills and build each part's kernel arguments."""
    device = meta.query_start_loc.device
    starts = [0, *accumulate(meta.query_lens)]
    decodes = [i for i, q in enumerate(meta.query_lens) if q == 1]
    prefills = [i for i, q in enumerate(meta.query_lens) if q > 1]
    return AiterPlan(
        decode=_decode_part(meta, decodes, starts, device) if decodes else None,
        prefill=_prefill_part(meta, prefills, starts, device) if prefills else None,
    )


def _decode_part(meta: AttentionMetadata, seqs: list[int], starts: list[int], device: torch.device) -> DecodePart:
    index = _int64(seqs, device)
    return DecodePart(
        rows=_int64([starts[i] for i in seqs], device),
        block_tables=meta.block_tables.index_select(0, index).contiguous(),
        context_lens=meta.seq_lens.index_select(0, index).contiguous(),
        cu_query_lens=torch.arange(len(seqs) + 1, dtype=torch.int32, device=device),
        max_context_len=max(meta.seq_lens_host[i] for i in seqs),
        all_rows=len(seqs) == meta.num_tokens,
    )


def _prefill_part(meta: AttentionMetadata, seqs: list[int], starts: list[int], device: torch.device) -> PrefillPart:
    rows: list[int] = []
    positions: list[int] = []
    owners: list[int] = []
    for i in seqs:
        rows.extend(range(starts[i], starts[i + 1]))
        positions.extend(range(meta.seq_lens_host[i]))
        owners.extend([i] * meta.seq_lens_host[i])
    pos = _int64(positions, device)
    blocks = meta.block_tables[_int64(owners, device), pos // meta.block_size].long()
    return PrefillPart(
        rows=_int64(rows, device),
        cu_seqlens_q=_int32([0, *accumulate(meta.query_lens[i] for i in seqs)], device),
        cu_seqlens_k=_int32([0, *accumulate(meta.seq_lens_host[i] for i in seqs)], device),
        max_seqlen_q=max(meta.query_lens[i] for i in seqs),
        max_seqlen_k=max(meta.seq_lens_host[i] for i in seqs),
        kv_slots=blocks * meta.block_size + pos % meta.block_size,
        all_rows=len(rows) == meta.num_tokens,
    )
