"""TEST DOUBLE of the three AITER functions the rocm_aiter backend calls. Never use it for serving.

AITER (https://github.com/ROCm/aiter) builds only against ROCm, so on other machines the plugin's tests put
this module into ``sys.modules["aiter"]``. Each function keeps AITER's signature, argument order, tensor
layouts and in-place conventions, checks the constraints the real kernels enforce (dtypes, layouts, block and
head sizes, scratch size), and computes the result with plain torch in float32. On a ROCm machine where the
real ``aiter`` imports, the same tests run against it instead and this module is not used.
"""

from __future__ import annotations

import itertools
import math

import torch

IS_TEST_DOUBLE = True

_ATTN_DTYPES = (torch.float16, torch.bfloat16)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(f"aiter test double: {message}")


def reshape_and_cache_flash(
    key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor, v_scale: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[num_tokens, num_heads, head_size]`` into caches
    ``[num_blocks, block_size, num_heads, head_size]`` at ``slot_mapping`` (the number of slots counts tokens).
    """
    _require(kv_cache_dtype == "auto", f"only unquantised caches are doubled, got {kv_cache_dtype!r}")
    _require(key_cache.dim() == 4 and key_cache.shape == value_cache.shape, "caches must be 4-D and alike")
    _require(key.shape[1:] == key_cache.shape[2:], f"key rows {tuple(key.shape)} do not fit {tuple(key_cache.shape)}")
    _require(slot_mapping.dtype == torch.int64, "slot_mapping must be int64")
    _require(k_scale.numel() == 1 and v_scale.numel() == 1, "per-tensor scales")
    tokens = slot_mapping.shape[0]
    flat_k = key_cache.view(-1, *key_cache.shape[2:])
    flat_v = value_cache.view(-1, *value_cache.shape[2:])
    flat_k[slot_mapping] = key[:tokens].to(key_cache.dtype)
    flat_v[slot_mapping] = value[:tokens].to(value_cache.dtype)


def flash_attn_varlen_func(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: float | None = None,
    causal: bool = False, window_size: tuple[int, int] = (-1, -1), alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False, return_lse: bool = False, return_attn_probs: bool = False,
) -> torch.Tensor:
    """Varlen attention over packed ``q`` ``[total_q, nheads, d]`` and ``k``/``v`` ``[total_k, nheads_k, d]``.

    With ``causal`` the mask is aligned to the bottom-right corner: query ``i`` of a sequence with ``sq``
    queries and ``sk`` keys sees keys ``[0, i + sk - sq]``. Returns ``[total_q, nheads, d]`` in ``q``'s dtype.
    """
    _require(q.dtype in _ATTN_DTYPES and k.dtype == q.dtype == v.dtype, f"fp16/bf16 only, got {q.dtype}")
    _require(cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32, "cu_seqlens must be int32")
    _require(dropout_p == 0.0 and window_size == (-1, -1) and alibi_slopes is None, "only plain attention")
    _require(q.shape[1] % k.shape[1] == 0, "query heads must group over key heads")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    group = q.shape[1] // k.shape[1]
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    _require(starts_q[-1] == q.shape[0] and starts_k[-1] == k.shape[0], "cu_seqlens do not match the tensors")
    out = torch.empty_like(q)
    for i in range(len(starts_q) - 1):
        sq, sk = starts_q[i + 1] - starts_q[i], starts_k[i + 1] - starts_k[i]
        _require(sq <= max_seqlen_q and sk <= max_seqlen_k, "a sequence is longer than max_seqlen")
        qi = q[starts_q[i]:starts_q[i + 1]].float().transpose(0, 1)  # [h, sq, d]
        ki = k[starts_k[i]:starts_k[i + 1]].float().repeat_interleave(group, 1).transpose(0, 1)
        vi = v[starts_k[i]:starts_k[i + 1]].float().repeat_interleave(group, 1).transpose(0, 1)
        scores = qi @ ki.transpose(1, 2) * scale
        if causal:
            hidden = torch.arange(sk)[None, :] > torch.arange(sq)[:, None] + (sk - sq)
            scores = scores.masked_fill(hidden.to(scores.device), float("-inf"))
        out[starts_q[i]:starts_q[i + 1]] = (scores.softmax(-1) @ vi).transpose(0, 1).to(q.dtype)
    return out


def paged_attention_v1(
    out: torch.Tensor, workspace_buffer: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
    value_cache: torch.Tensor, scale: float, block_tables: torch.Tensor, cu_query_lens: torch.Tensor | None,
    context_lens: torch.Tensor, max_context_len: int, alibi_slopes: torch.Tensor | None, kv_cache_dtype: str,
    kv_cache_layout: str, logits_soft_cap: float, k_scale: torch.Tensor, v_scale: torch.Tensor,
    fp8_out_scale: torch.Tensor | None = None, partition_size: int = 256, mtp: int = 1, sliding_window: int = 0,
) -> torch.Tensor:
    """Paged attention of ``query`` ``[num_seqs, num_heads, head_size]`` into ``out`` (same shape).

    With ``kv_cache_layout="NHD"`` the caches are ``[num_blocks, block_size, num_kv_heads, head_size]``;
    sequence ``i`` has ``context_lens[i]`` tokens (its new one included) in blocks ``block_tables[i]``.
    """
    _require(kv_cache_layout == "NHD" and kv_cache_dtype == "auto", "only unquantised NHD caches are doubled")
    _require(query.dtype in _ATTN_DTYPES and key_cache.dtype == query.dtype, f"fp16/bf16 only, got {query.dtype}")
    _require(alibi_slopes is None and logits_soft_cap == 0.0 and fp8_out_scale is None, "only plain attention")
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    _require(block_size in (1, 16, 32) and head_size in (64, 128), f"block {block_size}, head {head_size}")
    _require(block_tables.dtype == torch.int32 and context_lens.dtype == torch.int32, "int32 tables and lengths")
    partitions = math.ceil(max_context_len / partition_size)
    needed = num_seqs * num_heads * partitions * (head_size * query.element_size() + 8)
    _require(workspace_buffer.numel() * workspace_buffer.element_size() >= needed, "workspace too small")
    starts = cu_query_lens.tolist() if cu_query_lens is not None else list(range(num_seqs + 1))
    _require(all(b - a == 1 for a, b in itertools.pairwise(starts)), "one query per sequence (mtp=1)")
    group = num_heads // num_kv_heads
    for i, length in enumerate(context_lens.tolist()):
        _require(length <= max_context_len, "a context is longer than max_context_len")
        pos = torch.arange(length, device=key_cache.device)
        blocks = block_tables[i].long()[pos // block_size]
        keys = key_cache[blocks, pos % block_size].float().repeat_interleave(group, 1)  # [len, h, d]
        values = value_cache[blocks, pos % block_size].float().repeat_interleave(group, 1)
        scores = torch.einsum("hd,lhd->hl", query[i].float(), keys) * scale
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values).to(out.dtype)
    return out
