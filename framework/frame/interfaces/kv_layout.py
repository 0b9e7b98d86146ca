"""The paged KV layout from both sides: the pool that holds a model's KV, and the metadata that tells every backend
where a step's tokens read and write it. The only place :class:`~frame.interfaces.attention.AttentionMetadata`
is built: the runner, its recorded decode steps, a draft model, calibration and the attention test suite all set
up their paged forward here.

The pool is one tensor ``[layers, 2, blocks, block_size, kv_heads, width]``; layer ``i``'s key and value
caches are its views ``[i, 0]`` and ``[i, 1]``. With several KV groups (:mod:`frame.interfaces.kv_groups`) the
first dimension is the group size instead: a block belongs to one group at a time and holds that group's layers,
layer ``i`` being slot ``slot_of_layer[i]`` (the per-layer layout in :mod:`frame.interfaces.attention`). ``width``
is ``head_dim``, or ``head_dim + 4`` in a quantized pool (int8/fp8 codes and each row's scale,
:mod:`frame.interfaces.kv_dtype`).
Token slot ``s`` of a sequence whose block table is ``t`` is ``t[s // block_size] * block_size + s % block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from frame.interfaces.attention import AttentionMetadata
from frame.interfaces.kv_dtype import row_width
from frame.interfaces.kv_groups import KVGroups

if TYPE_CHECKING:
    from frame.interfaces.model import KVCacheSpec


class KVPool:
    """A model's paged KV on one rank: ``num_blocks`` blocks any request may own, plus ``scratch_blocks`` past
    them that none owns (padding rows of recorded decode steps write there). ``dtype`` is the KV dtype
    (``--kv-cache-dtype``): a float dtype, or int8/float8_e4m3fn codes with per-token, per-head scales.

    The storage is ``torch.empty`` unless ``zeroed``, because zeroing gigabytes costs seconds: a backend may
    gather whole blocks, but must keep the slots no sequence has written (which may hold NaN) out of its output
    (:mod:`frame.testing.attention_pool` checks it). ``groups``: the model's KV groups (None: one group of every
    layer)."""

    def __init__(self, spec: KVCacheSpec, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str, scratch_blocks: int = 0, zeroed: bool = False,
                 groups: KVGroups | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.scratch_blocks = scratch_blocks
        self.groups = groups or KVGroups.single(spec.num_layers)
        if self.groups.num_layers != spec.num_layers:
            raise ValueError(f"KV groups cover {self.groups.num_layers} layers, the model has {spec.num_layers}")
        make = torch.zeros if zeroed else torch.empty
        self.dtype = dtype
        self.tensor = make((self.groups.group_size, 2, num_blocks + scratch_blocks, block_size, spec.num_kv_heads,
                            row_width(spec.head_dim, dtype)), dtype=dtype, device=device)
        #: Each layer's ``(key_cache, value_cache)``, ``[blocks, block_size, kv_heads, head_dim]`` views.
        self.caches = [(self.tensor[i, 0], self.tensor[i, 1]) for i in self.groups.slot_of_layer]

    @property
    def first_scratch_block(self) -> int:
        """The id of the first block past the owned ones."""
        return self.num_blocks

    def copy_block(self, src: int, dst: int, num_tokens: int) -> None:
        """Copy slots ``[0, num_tokens)`` of block ``src`` into block ``dst``, in every layer."""
        self.tensor[:, :, dst, :num_tokens] = self.tensor[:, :, src, :num_tokens]


def slots_of(block_table: np.ndarray | Sequence[int], positions: np.ndarray, block_size: int) -> np.ndarray:
    """The KV slots (int64) of ``positions`` of a sequence with ``block_table``."""
    table = np.asarray(block_table, dtype=np.int64)
    return table[positions // block_size] * block_size + positions % block_size


def step_metadata(query_lens: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray, slot_mapping: np.ndarray,
                  block_size: int, device: torch.device | str, prompt: np.ndarray | None = None) -> AttentionMetadata:
    """The common metadata of a flat batch given on the host: each sequence's new tokens (``query_lens``), its
    length after the step (``seq_lens``), its block table (int32 ``[num_seqs, width]``, padded with 0), each new
    token's slot (int64 ``[num_tokens]``) and, where known, whether its new tokens are prompt tokens (``prompt``,
    bool ``[num_seqs]``); the tensors are copied to ``device``."""
    ends = np.cumsum(query_lens)
    return AttentionMetadata(
        query_start_loc=torch.from_numpy(np.concatenate(([0], ends)).astype(np.int32)).to(device),
        seq_lens=torch.from_numpy(np.asarray(seq_lens, dtype=np.int32)).to(device),
        block_tables=torch.from_numpy(np.ascontiguousarray(block_tables, dtype=np.int32)).to(device),
        slot_mapping=torch.from_numpy(np.asarray(slot_mapping, dtype=np.int64)).to(device),
        query_lens=np.asarray(query_lens).tolist(),
        seq_lens_host=np.asarray(seq_lens).tolist(),
        block_size=block_size,
        prompt=None if prompt is None else torch.from_numpy(np.asarray(prompt, dtype=np.bool_)).to(device),
    )


def sequence_metadata(context_lens: Sequence[int], query_lens: Sequence[int], block_tables: Sequence[Sequence[int]],
                      block_size: int, device: torch.device | str = "cpu") -> AttentionMetadata:
    """Metadata for sequences with ``context_lens`` cached tokens each adding ``query_lens`` new ones;
    ``block_tables[i]`` lists sequence ``i``'s block ids and must cover its ``context + query`` tokens."""
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    slots = []
    for table, context, total in zip(block_tables, context_lens, seq_lens, strict=True):
        if len(table) * block_size < total:
            raise ValueError(f"block table {list(table)} cannot hold {total} tokens of block size {block_size}")
        slots.append(slots_of(table, np.arange(context, total), block_size))
    width = max((len(t) for t in block_tables), default=0) or 1
    tables = np.zeros((len(block_tables), width), dtype=np.int32)
    for i, table in enumerate(block_tables):
        tables[i, : len(table)] = table
    return step_metadata(np.asarray(query_lens, dtype=np.int64), np.asarray(seq_lens, dtype=np.int64), tables,
                         np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64), block_size, device)


def decode_metadata(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    slot_mapping: torch.Tensor, num_seqs: int, max_seq_len: int, block_size: int,
                    ) -> AttentionMetadata:
    """Metadata over fixed device buffers for ``num_seqs`` decodes (one token each), as a recorded decode step
    reads them: views of the buffers' first rows, which the caller refills before each replay. The host lengths
    say ``max_seq_len`` for every row (a recording must not depend on the real ones)."""
    return AttentionMetadata(
        query_start_loc=query_start_loc[: num_seqs + 1], seq_lens=seq_lens[:num_seqs],
        block_tables=block_tables[:num_seqs], slot_mapping=slot_mapping[:num_seqs], query_lens=[1] * num_seqs,
        seq_lens_host=[max_seq_len] * num_seqs, block_size=block_size,
    )
