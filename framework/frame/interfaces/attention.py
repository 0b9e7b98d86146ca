"""AttentionBackend: paged attention over the KV layout the core defines.

KV layout (fixed by the core, shared by every backend): for each layer one key and one value tensor of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``; token slot ``s`` lives at block ``s // block_size``,
offset ``s % block_size``. An int8 / fp8 pool (``--kv-cache-dtype``) has rows of ``head_dim + 4`` instead: the
codes, then the row's float32 scale (:mod:`frame.interfaces.kv_dtype`). A step's batch is flat: ``num_tokens`` query
tokens from ``num_seqs`` sequences, each sequence's new tokens contiguous and in order, prefills, prefill chunks and
decodes mixed freely.

What a layer needs is an :class:`AttentionSpec`, which the model family states per layer: heads, KV heads, head
size, softmax scale, an optional sliding window and logit soft-cap, and whether the layer reads another layer's
KV instead of writing its own. The core creates one backend per distinct spec (after splitting the heads over the
tensor-parallel ranks); a backend that does not implement a window or a soft-cap is refused before the model loads.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Self

import torch


@dataclass(frozen=True)
class AttentionSpec:
    """The attention one layer needs, as its model family states it (global head counts, before any split).

    - ``scale``: the softmax scale applied to ``q . k`` (``head_dim ** -0.5`` for most models; Gemma's
      ``query_pre_attn_scalar ** -0.5``, Granite's ``attention_multiplier``);
    - ``sliding_window``: when set to ``W``, a query at position ``p`` sees keys ``(p - W, p]`` only (Mistral,
      Gemma's local layers), as transformers' ``sliding_window`` means; None: every key up to ``p``;
    - ``logit_softcap``: when set to ``c``, scores become ``c * tanh(scores / c)`` before the softmax (Gemma 2);
    - ``kv_source``: the index of an earlier layer whose KV cache this layer reads; it writes no KV of its own and
      needs no cache (cross-layer KV sharing). None: the layer has its own cache.
    """

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None = None
    logit_softcap: float | None = None
    kv_source: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads <= 0 or self.num_kv_heads <= 0 or self.head_dim <= 0:
            raise ValueError(f"attention needs positive head counts and size, got {self}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"a sliding window must be positive, got {self.sliding_window}")
        if self.logit_softcap is not None and self.logit_softcap <= 0:
            raise ValueError(f"a logit soft-cap must be positive, got {self.logit_softcap}")

    def with_heads(self, num_heads: int, num_kv_heads: int) -> AttentionSpec:
        """The same attention over another number of heads (one tensor-parallel rank's share)."""
        return dataclasses.replace(self, num_heads=num_heads, num_kv_heads=num_kv_heads)

    @property
    def features(self) -> list[str]:
        """What a backend must implement beyond plain causal attention, in words (``["sliding_window=4096"]``)."""
        found = []
        if self.sliding_window is not None:
            found.append(f"sliding_window={self.sliding_window}")
        if self.logit_softcap is not None:
            found.append(f"logit_softcap={self.logit_softcap:g}")
        return found


class UnsupportedAttentionError(ValueError):
    """A backend was asked for attention it does not implement (a sliding window, a logit soft-cap)."""


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

    Host copies (``query_lens``, ``seq_lens_host``) let backends plan without device syncs. ``prompt`` (bool
    ``[num_seqs]``, or None where the builder does not say) marks the sequences whose new tokens are prompt tokens,
    a prefill or a chunk of one however few tokens it has, against decodes (a sampled token, and drafts): a backend
    may give prompt rows the path a long prefill takes, so that a prompt's last token gets the same bits whether it
    came in a long step or alone after a prefix-cache hit (``cpu_paged`` does, see its README).
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens: list[int]
    seq_lens_host: list[int]
    block_size: int
    # Keyword-only: backends' subclasses add fields without defaults after it.
    prompt: torch.Tensor | None = dataclasses.field(default=None, kw_only=True)

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


@dataclass
class GroupedMetadata:
    """A step's metadata for a model whose cache layers are in several KV groups
    (:mod:`frame.interfaces.kv_groups`): each group's layers read and write through their own block tables, so each
    group has its own metadata (``groups[g]``, as the backend's :meth:`AttentionBackend.build_metadata` made it).
    The runner passes this to ``CausalLM.forward`` in place of one :class:`AttentionMetadata`; a model hands each
    layer :func:`layer_metadata` of it."""

    groups: list[AttentionMetadata]
    group_of_layer: list[int]  # for each cache layer (a layer with its own KV), its group

    def for_layer(self, cache_layer: int) -> AttentionMetadata:
        return self.groups[self.group_of_layer[cache_layer]]


def layer_metadata(meta: AttentionMetadata | GroupedMetadata, cache_layer: int) -> AttentionMetadata:
    """The metadata the layer using KV cache ``cache_layer`` attends with: ``meta`` itself when the model has one
    KV group."""
    return meta.for_layer(cache_layer) if isinstance(meta, GroupedMetadata) else meta


class AttentionBackend(ABC):
    """Writes a step's new K/V into the paged pool and computes causal attention for its queries.

    One instance serves every layer of one :class:`AttentionSpec` (layers differ only in the cache tensors passed
    in); a model whose layers differ in scale, window or soft-cap gets one instance per distinct spec, all of the
    same plugin, and every instance reads the metadata that the first one's :meth:`build_metadata` made, so that
    metadata must not depend on the window, the soft-cap or the scale. Query token ``j`` of a sequence with context
    ``c`` before this step attends to positions ``[0, c + j]`` of that sequence, or with a sliding window ``W`` to
    ``(c + j - W, c + j]``.
    """

    #: True when :meth:`forward` takes query/key/value whose tokens are strided (each token's ``[heads, head_dim]``
    #: contiguous), such as column slices of a fused QKV output; models then skip copying them.
    accepts_strided_tokens: bool = False
    #: True when every kernel launch depends only on the metadata's tensors and the query count, never on its host
    #: lists (``seq_lens_host``), so a platform may record a decode step once and replay it with new tensor values
    #: (CUDA graphs). The engine records only over backends that say so.
    supports_graphs: bool = False
    #: True when the backend honours ``sliding_window`` (since API 2, issue 18); the base refuses a window
    #: otherwise, so a backend never silently attends to keys outside it.
    supports_sliding_window: bool = False
    #: True when the backend honours ``logit_softcap``; the base refuses a soft-cap otherwise.
    supports_logit_softcap: bool = False

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
                 sliding_window: int | None = None, logit_softcap: float | None = None):
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
        name = type(self).__name__
        if sliding_window is not None and not self.supports_sliding_window:
            raise UnsupportedAttentionError(f"{name} does not implement sliding-window attention")
        if logit_softcap is not None and not self.supports_logit_softcap:
            raise UnsupportedAttentionError(f"{name} does not implement attention logit soft-capping")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.dtype = dtype
        self.sliding_window = sliding_window
        self.logit_softcap = logit_softcap

    @property
    def spec(self) -> AttentionSpec:
        """The attention this instance computes (its rank's heads)."""
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, self.scale, self.sliding_window,
                             self.logit_softcap)

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
