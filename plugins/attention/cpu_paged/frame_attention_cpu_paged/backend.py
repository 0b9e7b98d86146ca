"""CpuPagedAttention: paged attention through the native kernel, one call per layer for the whole batch."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.kv_dtype import is_quantized

from frame_attention_cpu_paged import kernel


class CpuPagedAttention(AttentionBackend):
    """Writes K/V by slot and attends in one C++ call, reading each context in place through its block table.

    No per-layer gathers or padded copies: the kernel walks the block table, folds the query heads of a KV head
    together (each K/V row is read once for all of them) and keeps an online softmax in float32. Queries and
    outputs stay in the model's dtype; the cache may be float32, bfloat16 or float16, or int8 / fp8 codes with a
    float32 scale per token and KV head (:mod:`frame.interfaces.kv_dtype`), which the kernel quantizes as it writes
    and dequantizes as it widens each 16-key chunk to float32 (the float path's loops). A sliding window starts each
    query's walk at its window and masks the keys before it; a soft-cap maps scores through ``c * tanh(s / c)``. Both
    run on the kernel's generic loops (compiler-vectorised), not its AVX-512 or AVX2 paths.
    """

    accepts_strided_tokens = True
    supports_graphs = True  # one kernel call per layer, everything read from the metadata's tensors
    supports_sliding_window = True
    supports_logit_softcap = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
                 sliding_window: int | None = None, logit_softcap: float | None = None):
        super().__init__(num_heads, num_kv_heads, head_dim, scale, dtype, sliding_window, logit_softcap)
        # The kernel's encoding of "none" for both is 0.
        self._limits = (sliding_window or 0, logit_softcap or 0.0)
        kernel.load()
        self._attention = torch.ops.frame_cpu_paged.attention.default
        self._forward = torch.ops.frame_cpu_paged.forward.default
        self._write = torch.ops.frame_cpu_paged.write.default

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Copy (or quantize) each new token's K/V row into its slot of the pool, natively."""
        self._write(self._stored(key, k_cache), self._stored(value, v_cache), k_cache, v_cache, slot_mapping)

    def attend(
        self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Causal attention of every query row over its sequence's cached context (new tokens included)."""
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        self._attention(out, query, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens,
                        self.scale, *self._limits, meta.prompt)
        return out

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Store the new K/V and attend, in one native call (token rows may be strided: columns of a QKV output)."""
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        self._forward(out, query, self._stored(key, k_cache), self._stored(value, v_cache), k_cache, v_cache,
                      meta.slot_mapping, meta.block_tables, meta.query_start_loc, meta.seq_lens, self.scale,
                      *self._limits, meta.prompt)
        return out

    @staticmethod
    def _stored(rows: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """New K or V rows as the kernel's write takes them: in a float cache's dtype; as they are for a quantized
        cache, which the kernel quantizes."""
        return rows if is_quantized(cache.dtype) else rows.to(cache.dtype)
