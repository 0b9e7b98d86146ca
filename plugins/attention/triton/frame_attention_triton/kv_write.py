"""The KV write kernel: scatters a step's new keys and values into the paged pool through ``slot_mapping``.

One program per new token copies its ``[num_kv_heads, head_dim]`` key and value rows into slot
``slot_mapping[t]``, i.e. block ``slot // block_size``, offset ``slot % block_size`` of the
``[num_blocks, block_size, num_kv_heads, head_dim]`` caches. Values are cast to the cache dtype on store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    BLOCK_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_P: tl.constexpr, HEAD_DIM_P: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, HEADS_P)
    dims = tl.arange(0, HEAD_DIM_P)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)

    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kcs + heads[:, None] * stride_kch + dims[None, :]
    v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vcs + heads[:, None] * stride_vch + dims[None, :]
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check_rows(name: str, rows: torch.Tensor, cache: torch.Tensor) -> None:
    if rows.dim() != 3 or rows.shape[1:] != cache.shape[2:]:
        raise ValueError(f"{name} has shape {tuple(rows.shape)}, but the cache holds rows of {tuple(cache.shape[2:])}")
    if rows.stride(-1) != 1 or cache.stride(-1) != 1:
        raise ValueError(f"{name} and its cache must be contiguous in head_dim")


def write_kv(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``[num_tokens, num_kv_heads, head_dim]`` at ``slot_mapping`` ``[num_tokens]``.

    Mutates ``k_cache`` and ``v_cache`` (``[num_blocks, block_size, num_kv_heads, head_dim]``) in place, on
    the caches' device; raises ValueError on mismatched shapes.
    """
    num_tokens = key.shape[0]
    if slot_mapping.shape[0] != num_tokens or value.shape[0] != num_tokens:
        raise ValueError(
            f"slot_mapping has {slot_mapping.shape[0]} slots for {num_tokens} keys and {value.shape[0]} values"
        )
    _check_rows("key", key, k_cache)
    _check_rows("value", value, v_cache)
    if num_tokens == 0:
        return
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        BLOCK_SIZE=block_size, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_P=triton.next_power_of_2(num_kv_heads), HEAD_DIM_P=triton.next_power_of_2(head_dim),
    )
