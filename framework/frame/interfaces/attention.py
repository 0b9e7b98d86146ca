"""AttentionBackend: paged attention over the KV layout the core defines.

KV layout (fixed by the core, shared by every backend): for each layer one key and one value tensor of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``; token slot ``s`` lives at block ``s // block_size``,
offset ``s % block_size``. A step's batch is flat: ``num_tokens`` query tokens from ``num_seqs`` sequences,
each sequence's new tokens contiguous and in order, prefills, prefill chunks and decodes mixed freely.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Self

import torch


@dataclass
class AttentionMetadata:
    """Where every token of the step's flat batch reads and writes KV: the part every backend shares.

    The runner builds one per step and hands it to :meth:`AttentionBackend.build_metadata`, which returns the
    metadata every layer then receives: this object, or the backend's own subclass that adds what it precomputes
    once per step (a gather plan, tile lists). Tensors (on the model's device):

    - ``query_start_loc`` int32 ``[num_seqs + 1]``: sequence ``i``'s query tokens are rows
      ``query_start_loc[i]:query_start_loc[i+1]`` of the batch;
    - ``seq_lens`` int32 ``[num_seqs]``: context length after this step (cached tokens + new tokens);
    - ``block_tables`` int32 ``[num_seqs, max_blocks]``: each sequence's block ids, padded with 0;
    - ``slot_mapping`` int64 ``[num_tokens]``: the KV slot each new token writes.

    Host copies (``query_lens``, ``seq_lens_host``) let backends plan without device syncs.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens: list[int]
    seq_lens_host: list[int]
    block_size: int

    @classmethod
    def extend(cls, common: AttentionMetadata, **fields: Any) -> Self:
        """A backend's subclass built from the common metadata plus its own ``fields``."""
        return cls(**{f.name: getattr(common, f.name) for f in dataclasses.fields(AttentionMetadata)}, **fields)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)

    @property
    def context_lens(self) -> list[int]:
        """Tokens already cached before this step, per sequence."""
        return [s - q for s, q in zip(self.seq_lens_host, self.query_lens, strict=True)]

    @property
    def is_pure_decode(self) -> bool:
        """True when every sequence adds exactly one token."""
        return self.max_query_len == 1


class AttentionBackend(ABC):
    """Writes a step's new K/V into the paged pool and computes causal attention for its queries.

    One instance serves every layer of a model (layers differ only in the cache tensors passed in). Query token
    ``j`` of a sequence with context ``c`` before this step attends to positions ``[0, c + j]`` of that sequence.
    """

    #: True when :meth:`forward` takes query/key/value whose tokens are strided (each token's ``[heads, head_dim]``
    #: contiguous), such as column slices of a fused QKV output; models then skip copying them.
    accepts_strided_tokens: bool = False
    #: True when every kernel launch depends only on the metadata's tensors and the query count, never on its host
    #: lists (``seq_lens_host``), so a platform may record a decode step once and replay it with new tensor values
    #: (CUDA graphs). The engine records only over backends that say so.
    supports_graphs: bool = False

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype):
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.dtype = dtype

    def build_metadata(self, common: AttentionMetadata) -> AttentionMetadata:
        """The metadata every layer of this step receives, built once per step before the first layer.

        Return ``common`` itself, or an instance of the backend's own :class:`AttentionMetadata` subclass that adds
        what the backend precomputes per step (``MyMetadata.extend(common, plan=...)``). Since API 2 (API 1's
        ``prepare`` filled an untyped ``extras`` dict).
        """
        return common

    @abstractmethod
    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` into the caches at ``slot_mapping``."""

    @abstractmethod
    def attend(
        self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Attention of ``query`` ``[num_tokens, num_heads, head_dim]`` over the cached KV (new tokens included).

        Returns ``[num_tokens, num_heads, head_dim]`` in the query's dtype.
        """

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Write the new K/V, then attend; what a model layer calls."""
        self.write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        return self.attend(query, k_cache, v_cache, meta)
