"""AiterAttentionBackend: frame's AttentionBackend on AMD's AITER kernels.

The three AITER functions it calls, and how frame's data is handed to them:

- ``aiter.reshape_and_cache_flash`` writes new K/V through ``slot_mapping`` into caches in frame's layout;
- ``aiter.paged_attention_v1`` (``kv_cache_layout="NHD"``) attends every decode over the paged caches as-is;
- ``aiter.flash_attn_varlen_func`` (``causal=True``, aligned bottom-right) attends prefills and prefill chunks
  over their context gathered into contiguous K/V (see :mod:`frame_attention_rocm_aiter.plan`).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from types import ModuleType

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata

from frame_attention_rocm_aiter.plan import AiterPlan, DecodePart, PrefillPart, build_plan

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128)
#: Context tokens per partition of AITER's paged attention (its kernels are built for 256).
PARTITION_SIZE = 256


def workspace_bytes(num_seqs: int, num_heads: int, head_dim: int, max_context_len: int, dtype: torch.dtype) -> int:
    """Scratch AITER's paged attention needs: partial outputs plus a max and a sum (float32) per partition."""
    partitions = math.ceil(max_context_len / PARTITION_SIZE)
    per_head = partitions * (head_dim * torch.finfo(dtype).bits // 8 + 2 * 4)
    return num_seqs * num_heads * per_head


@dataclass
class AiterMetadata(AttentionMetadata):
    """The common metadata plus the step's split into AITER calls (built once per step)."""

    plan: AiterPlan


class AiterAttentionBackend(AttentionBackend):
    """Paged attention on AITER: float16 or bfloat16, head sizes 64 and 128, block sizes 16 and 32.

    Imports ``aiter`` when created (raising ImportError when it does not import). :meth:`build_metadata` adds an
    :class:`~frame_attention_rocm_aiter.plan.AiterPlan` to the step's metadata.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
                 sliding_window: int | None = None, logit_softcap: float | None = None):
        # The base refuses a window or a soft-cap: AITER's kernels take them, but frame does not pass them yet.
        super().__init__(num_heads, num_kv_heads, head_dim, scale, dtype, sliding_window, logit_softcap)
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"AITER's attention kernels compute in float16 or bfloat16, not {dtype}")
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"AITER's paged attention is built for head sizes 64 and 128, not {head_dim}")
        self.aiter: ModuleType = importlib.import_module("aiter")
        self._scales: dict[torch.device, torch.Tensor] = {}

    def _unit_scale(self, device: torch.device) -> torch.Tensor:
        """The K/V dequantisation scale AITER takes even for unquantised caches: 1.0, one per device."""
        if device not in self._scales:
            self._scales[device] = torch.ones(1, dtype=torch.float32, device=device)
        return self._scales[device]

    def build_metadata(self, common: AttentionMetadata) -> AiterMetadata:
        return AiterMetadata.extend(common, plan=self._plan(common))

    @staticmethod
    def _plan(meta: AttentionMetadata) -> AiterPlan:
        if meta.block_size not in (16, 32):
            raise ValueError(f"AITER's paged attention takes block sizes 16 and 32, not {meta.block_size}")
        return build_plan(meta)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        scale = self._unit_scale(k_cache.device)
        self.aiter.reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, "auto", scale, scale)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        plan = meta.plan if isinstance(meta, AiterMetadata) else self._plan(meta)
        out = torch.empty_like(query)
        if plan.decode is not None:
            self._decode(query, k_cache, v_cache, plan.decode, out)
        if plan.prefill is not None:
            self._prefill(query, k_cache, v_cache, plan.prefill, out)
        return out

    def _decode(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, part: DecodePart,
                out: torch.Tensor) -> None:
        q = query.contiguous() if part.all_rows else query.index_select(0, part.rows)
        result = out if part.all_rows else torch.empty_like(q)
        workspace = torch.empty(
            workspace_bytes(part.num_seqs, self.num_heads, self.head_dim, part.max_context_len, query.dtype),
            dtype=torch.uint8, device=query.device,
        )
        scale = self._unit_scale(k_cache.device)
        self.aiter.paged_attention_v1(
            result, workspace, q, k_cache, v_cache, self.scale, part.block_tables, part.cu_query_lens,
            part.context_lens, part.max_context_len, None, "auto", "NHD", 0.0, scale, scale, None, PARTITION_SIZE,
        )
        if not part.all_rows:
            out.index_copy_(0, part.rows, result)

    def _prefill(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, part: PrefillPart,
                 out: torch.Tensor) -> None:
        q = query.contiguous() if part.all_rows else query.index_select(0, part.rows)
        keys = k_cache.view(-1, self.num_kv_heads, self.head_dim).index_select(0, part.kv_slots)
        values = v_cache.view(-1, self.num_kv_heads, self.head_dim).index_select(0, part.kv_slots)
        result = self.aiter.flash_attn_varlen_func(
            q, keys, values, part.cu_seqlens_q, part.cu_seqlens_k, part.max_seqlen_q, part.max_seqlen_k,
            dropout_p=0.0, softmax_scale=self.scale, causal=True,
        )
        if part.all_rows:
            out.copy_(result)
        else:
            out.index_copy_(0, part.rows, result)
