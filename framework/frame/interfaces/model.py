"""CausalLM: a model family's network, run by the model runner over one flat batch per step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from frame.interfaces.attention import AttentionMetadata, GroupedMetadata
from frame.interfaces.kv_dtype import kv_bytes_per_token


@dataclass(frozen=True)
class KVCacheSpec:
    """What the runner needs to size and allocate the KV pool for a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes of one token's K and V across all layers in a pool of ``dtype`` (a quantized one's scales
        included, :mod:`frame.interfaces.kv_dtype`)."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, dtype)

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        """Bytes of one block across all layers, keys and values."""
        return block_size * self.bytes_per_token(dtype)


class WeightSource(ABC):
    """A checkpoint's tensors, streamed one at a time.

    ``format`` says how names are spelled: ``"safetensors"`` uses Hugging Face names
    (``model.layers.0.self_attn.q_proj.weight``), ``"gguf"`` uses llama.cpp names (``blk.0.attn_q.weight``) with
    tensors already dequantised to float32 and in llama.cpp's layout. The model family maps names to its own.
    """

    format: Literal["safetensors", "gguf"]

    @abstractmethod
    def __len__(self) -> int:
        """Number of tensors (for progress bars)."""

    @abstractmethod
    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` pairs, each tensor on the CPU."""


class CausalLM(torch.nn.Module, ABC):
    """A decoder-only language model over paged KV.

    Built by a model family plugin on the meta device or directly on the target device; the runner then
    calls :meth:`load_weights`, allocates the KV pool from :attr:`kv_cache_spec` and calls :meth:`forward` once
    per step with the flat batch.
    """

    @property
    @abstractmethod
    def kv_cache_spec(self) -> KVCacheSpec:
        """Layers, KV heads and head size of the model's attention."""

    @abstractmethod
    def load_weights(self, source: WeightSource) -> None:
        """Copy every tensor of ``source`` into the parameters; raise ValueError naming a missing or unknown one."""

    @abstractmethod
    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata | GroupedMetadata,
    ) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` for the flat batch ``input_ids``/``positions`` (int64).

        ``kv_caches[i]`` is layer ``i``'s (key, value) pool in the core's layout; new tokens' KV is written there.
        ``meta`` is a :class:`~frame.interfaces.attention.GroupedMetadata` when the layers' KV lives in several KV
        groups (layers of different windows): each layer attends with ``layer_metadata(meta, i)`` for its cache
        ``i``.
        """

    @abstractmethod
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[n, vocab]`` for hidden states ``[n, hidden]``."""


