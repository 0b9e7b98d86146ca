"""TritonAttentionBackend: frame's AttentionBackend on the Triton kernels of this package."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata

from frame_attention_triton.kv_write import write_kv
from frame_attention_triton.options import TritonOptions
from frame_attention_triton.paged_attention import paged_attention
from frame_attention_triton.planning import TilePlan, build_plan

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_PLAN_KEY = "triton.plan"


class TritonAttentionBackend(AttentionBackend):
    """Paged attention as two Triton kernels: a slot-wise KV write and one mixed-batch attention kernel.

    :meth:`prepare` cuts the step's queries into tiles (``meta.extras["triton.plan"]``, a :class:`TilePlan`);
    every layer's :meth:`attend` reuses that plan. Block sizes must be multiples of 16.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
                 options: TritonOptions | None = None):
        super().__init__(num_heads, num_kv_heads, head_dim, scale, dtype)
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"the triton backend computes in float16, bfloat16 or float32, not {dtype}")
        self.options = options or TritonOptions()

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    def prepare(self, meta: AttentionMetadata) -> None:
        """Build the step's tile plan into ``meta.extras`` (host work only, one small copy to the device)."""
        meta.extras[_PLAN_KEY] = build_plan(
            meta.query_lens, self.group, self.options.prefill_block_m, meta.query_start_loc.device
        )

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        plan = meta.extras.get(_PLAN_KEY)
        if not isinstance(plan, TilePlan):
            self.prepare(meta)
            plan = meta.extras[_PLAN_KEY]
        return paged_attention(
            query, k_cache, v_cache, query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens,
            block_tables=meta.block_tables, plan=plan, scale=self.scale,
        )
