"""GatherAttention: paged attention one sequence at a time (an author's fill-in of the skeleton)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from frame.interfaces.attention import AttentionBackend, AttentionMetadata


class GatherAttention(AttentionBackend):
    """Writes K/V by slot; attends by gathering each sequence's context through its block table into one SDPA."""

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        rows = slot_mapping.long()
        k_cache.view(-1, self.num_kv_heads, self.head_dim)[rows] = key.to(k_cache.dtype)
        v_cache.view(-1, self.num_kv_heads, self.head_dim)[rows] = value.to(v_cache.dtype)

    def attend(
        self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        out = torch.empty_like(query)
        keys = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        values = v_cache.view(-1, self.num_kv_heads, self.head_dim)
        per_kv_head = self.num_heads // self.num_kv_heads
        first = 0
        for seq, (new, total) in enumerate(zip(meta.query_lens, meta.seq_lens_host, strict=True)):
            pos = torch.arange(total, device=query.device)
            where = meta.block_tables[seq].long()[pos // meta.block_size] * meta.block_size + pos % meta.block_size
            k = keys[where].transpose(0, 1).repeat_interleave(per_kv_head, dim=0)
            v = values[where].transpose(0, 1).repeat_interleave(per_kv_head, dim=0)
            q = query[first : first + new].transpose(0, 1).to(k.dtype)
            visible = pos[None, :] <= pos[total - new :, None]  # causal, shifted by the cached context
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=self.scale)
            out[first : first + new] = attended.transpose(0, 1).to(query.dtype)
            first += new
        return out
