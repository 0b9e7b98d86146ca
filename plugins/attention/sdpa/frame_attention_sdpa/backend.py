"""SdpaAttention: paged KV attention with torch's scaled_dot_product_attention, on any torch device."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.kv_dtype import dequantize_rows, is_quantized, write_rows

from frame_attention_sdpa.plan import DecodeGroup, PrefillSeq, SdpaPlan, build_plan

#: Up to this many KV heads, decode folds the queries block-diagonally (its multiply-adds grow with the KV head
#: count). Measured faster than the SDPA path at 3 KV heads (SmolLM2); more heads keep SDPA until measured.
_MAX_FOLDED_KV_HEADS = 4


@dataclass
class SdpaMetadata(AttentionMetadata):
    """The common metadata plus the step's gather plan, built once per step and read by every layer."""

    plan: SdpaPlan


class SdpaAttention(AttentionBackend):
    """Writes K/V by slot, then attends by gathering each sequence's context through its block table.

    Single-token (decode) sequences are bucketed by length; each bucket gathers its contexts whole blocks at a
    time and attends with two batched matmuls, the query heads folded onto their KV head so no KV is repeated.
    Every sequence with several new tokens (a prefill or a prefill chunk) gets its own SDPA call, causal and
    shifted by its cached context. A sliding window narrows the masks; a logit soft-cap, which SDPA cannot apply
    between its product and its softmax, takes explicit matmuls in float32 instead. An int8 or fp8 cache (rows of
    codes and a scale, :mod:`frame.interfaces.kv_dtype`) is quantized as it is written and dequantized to the model's
    dtype as it is gathered, so only the gathered blocks are ever held in floats.
    """

    supports_sliding_window = True
    supports_logit_softcap = True

    def build_metadata(self, common: AttentionMetadata) -> SdpaMetadata:
        """Build the step's gather plan once; every layer reuses it."""
        return SdpaMetadata.extend(common, plan=build_plan(common))

    def write_kv(
        self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Copy each new token's K/V row to its slot in the flattened ``[slots, num_kv_heads, width]`` pool
        (quantized for an int8/fp8 pool)."""
        write_rows(k_cache, slot_mapping, key)
        write_rows(v_cache, slot_mapping, value)

    def attend(
        self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Causal attention of every query row over its sequence's cached context (new tokens included)."""
        plan = meta.plan if isinstance(meta, SdpaMetadata) else build_plan(meta)
        k_flat = k_cache.view(-1, self.num_kv_heads, k_cache.shape[-1])
        v_flat = v_cache.view(-1, self.num_kv_heads, v_cache.shape[-1])
        out = torch.empty_like(query)
        for group in plan.decodes:
            out.index_copy_(0, group.rows, self._decode(query, k_cache, v_cache, group))
        for seq in plan.prefills:
            out[seq.start : seq.start + seq.query_len] = self._prefill(query, k_flat, v_flat, seq)
        return out

    def _decode(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup):
        """Attention of one decode group: whole-block gathers, then two batched matmuls and an fp32 softmax."""
        if self.num_kv_heads > _MAX_FOLDED_KV_HEADS:
            return self._decode_sdpa(query, k_cache, v_cache, group)
        batch, length = group.rows.numel(), group.num_blocks * k_cache.shape[1]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        groups = heads // kv_heads
        q = query.index_select(0, group.rows).to(self._compute_dtype(k_cache))
        # Block-diagonal queries: row h of KV head kv holds q_h in columns kv*dim:(kv+1)*dim, zeros elsewhere.
        # The gathered [B, T, kv_heads * dim] context is then one contiguous matrix per sequence, so no KV
        # transpose, copy or repeat per query head is needed (kv_heads x more multiply-adds, all cheap).
        q_bd = q.new_zeros(batch, kv_heads, groups, kv_heads, dim)
        q_bd.diagonal(dim1=1, dim2=3).copy_(q.view(batch, kv_heads, groups, dim).permute(0, 2, 3, 1))
        k = self._gather(k_cache, group.blocks).view(batch, length, kv_heads * dim)
        v = group.clear_padding(self._gather(v_cache, group.blocks).view(batch, length, kv_heads * dim))
        scores = torch.bmm(q_bd.view(batch, heads, kv_heads * dim), k.transpose(1, 2))
        # masked_fill, not adding the -inf bias: a padded slot's score may be NaN, and NaN - inf is NaN.
        scores = self._capped(scores.float().mul_(self.scale)).masked_fill_(group.hidden(self.sliding_window),
                                                                            float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out = torch.bmm(probs, v).view(batch, kv_heads, groups, kv_heads, dim).diagonal(dim1=1, dim2=3)
        return out.permute(0, 3, 1, 2).reshape(batch, heads, dim).to(query.dtype)

    def _decode_sdpa(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup):
        """Padded, masked SDPA over the gathered blocks; for many KV heads, where folding would waste work."""
        batch, length = group.rows.numel(), group.num_blocks * k_cache.shape[1]
        groups = self.num_heads // self.num_kv_heads
        # Query heads h = kv * groups + g all read KV head kv: fold them into the query length of that head.
        q = query.index_select(0, group.rows).to(self._compute_dtype(k_cache))
        q = q.view(batch, self.num_kv_heads, groups, self.head_dim)
        k = group.clear_padding(self._gather(k_cache, group.blocks).view(batch, length, -1))
        v = group.clear_padding(self._gather(v_cache, group.blocks).view(batch, length, -1))
        k, v = (x.view(batch, length, self.num_kv_heads, self.head_dim) for x in (k, v))
        if self.logit_softcap is not None:
            o = self._explicit(q, k.transpose(1, 2), v.transpose(1, 2),
                               group.bias(torch.float32, self.sliding_window)[:, None])
        else:
            bias = group.bias(q.dtype, self.sliding_window)[:, None]
            o = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias,
                                               scale=self.scale)
        return o.reshape(batch, self.num_heads, self.head_dim).to(query.dtype)

    def _prefill(self, query: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, seq: PrefillSeq):
        q = query[seq.start : seq.start + seq.query_len].to(self._compute_dtype(k_flat)).transpose(0, 1)
        groups = self.num_heads // self.num_kv_heads
        # K/V repeated per query head rather than enable_gqa, which sends torch's CPU SDPA to its slow math path.
        k = self._gather(k_flat, seq.slots).transpose(0, 1).repeat_interleave(groups, dim=0)
        v = self._gather(v_flat, seq.slots).transpose(0, 1).repeat_interleave(groups, dim=0)
        if self.logit_softcap is not None:
            bias = torch.zeros(seq.visible(self.sliding_window).shape, dtype=torch.float32, device=q.device)
            o = self._explicit(q, k, v, bias.masked_fill_(~seq.visible(self.sliding_window), float("-inf")))
            return o.transpose(0, 1).to(query.dtype)
        mask = seq.mask if self.sliding_window is None else seq.visible(self.sliding_window)
        o = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=mask, is_causal=mask is None, scale=self.scale
        )
        return o[0].transpose(0, 1).to(query.dtype)

    def _compute_dtype(self, cache: torch.Tensor) -> torch.dtype:
        """The dtype attention runs in: the cache's, or the model's for a quantized cache."""
        return self.dtype if is_quantized(cache.dtype) else cache.dtype

    def _gather(self, cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``cache``'s rows at ``index`` along its first dimension, dequantized when the cache is quantized."""
        rows = cache.index_select(0, index)
        return dequantize_rows(rows, self.dtype) if is_quantized(cache.dtype) else rows

    def _capped(self, scores: torch.Tensor) -> torch.Tensor:
        """``c * tanh(scores / c)`` for a soft-capped layer (float32 scores, already scaled); as is otherwise."""
        if self.logit_softcap is None:
            return scores
        return torch.tanh(scores / self.logit_softcap).mul_(self.logit_softcap)

    def _explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """``softmax(cap(q k^T * scale) + bias) v`` in float32 over matching leading dimensions, in ``v``'s dtype."""
        scores = self._capped(torch.matmul(q.float(), k.float().transpose(-1, -2)).mul_(self.scale)).add_(bias)
        return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(v.dtype)
