"""TritonAttentionBackend: frame's AttentionBackend on the Triton kernels of this package."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata

from frame_attention_triton.kv_write import write_kv
from frame_attention_triton.options import TritonOptions
from frame_attention_triton.paged_attention import paged_attention
from frame_attention_triton.planning import TilePlan, build_plan

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class TritonMetadata(AttentionMetadata):
    """The common metadata plus the step's tile plan (built once per step, read by every layer)."""

    plan: TilePlan


class TritonAttentionBackend(AttentionBackend):
    """Paged attention as two Triton kernels: a slot-wise KV write and one mixed-batch attention kernel.

    :meth:`build_metadata` cuts the step's queries into tiles (a :class:`TilePlan` in :class:`TritonMetadata`);
    every layer's :meth:`attend` reuses that plan. Block sizes must be multiples of 16. Sliding windows and logit
    soft-caps are compiled into the kernel only for the layers that have them.
    """

    #: The grid comes from the tile plan (fixed for a decode bucket); context lengths and block tables are read
    #: from device tensors in the kernel.
    supports_graphs = True
    supports_sliding_window = True
    supports_logit_softcap = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
                 options: TritonOptions | None = None, sliding_window: int | None = None,
                 logit_softcap: float | None = None):
        super().__init__(num_heads, num_kv_heads, head_dim, scale, dtype, sliding_window, logit_softcap)
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"the triton backend computes in float16, bfloat16 or float32, not {dtype}")
        self.options = options or TritonOptions()

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    def build_metadata(self, common: AttentionMetadata) -> TritonMetadata:
        """The step's tile plan (host work only, one small copy to the device)."""
        return TritonMetadata.extend(common, plan=self._plan(common))

    def _plan(self, meta: AttentionMetadata) -> TilePlan:
        return build_plan(meta.query_lens, self.group, self.options.prefill_block_m, meta.query_start_loc.device)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        write_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        plan = meta.plan if isinstance(meta, TritonMetadata) else self._plan(meta)
        return paged_attention(
            query, k_cache, v_cache, query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens,
            block_tables=meta.block_tables, plan=plan, scale=self.scale, sliding_window=self.sliding_window,
            logit_softcap=self.logit_softcap,
        )
