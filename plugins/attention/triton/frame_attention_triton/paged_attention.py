"""The paged attention kernel: one launch for a batch that mixes prefills, prefill chunks and decodes.

Each program owns one query tile (see :mod:`planning`) and one KV head. It loads the tile's queries once,
then walks the sequence's KV blocks through its block table, one block per iteration, and keeps a
flash-attention style online softmax (running max ``m``, running sum ``l``, rescaled accumulator) in float32.
A query at position ``p`` (its context before the step plus its index in the step) sees keys ``[0, p]``; the
walk stops at the last key any row of the tile can see, so a prefill's early tiles skip the later blocks. With a
sliding window ``W`` it sees ``(p - W, p]`` and the walk starts at the first row's window; with a logit soft-cap
``c`` scores become ``c * tanh(s / c)`` before the softmax (both switched on by constexpr flags, so layers without
them compile the kernel as before).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from frame_attention_triton.planning import TilePlan

_LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    tile_seq_ptr, tile_q0_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    scale_log2, window, softcap,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, IEEE_DOT: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    q_begin = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len

    # Row r of the tile is query token q0 + r // GROUP_P, query head kv_head * GROUP + r % GROUP_P.
    rows = tl.arange(0, BLOCK_Q * GROUP_P)
    q_idx = q0 + rows // GROUP_P
    head = kv_head * GROUP + rows % GROUP_P
    row_ok = (q_idx < q_len) & (rows % GROUP_P < GROUP)
    dims = tl.arange(0, HEAD_DIM_P)
    dim_ok = dims < HEAD_DIM
    token = (q_begin + q_idx).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    q_pos = context + q_idx

    m_i = tl.full([BLOCK_Q * GROUP_P], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_P], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_P, HEAD_DIM_P], dtype=tl.float32)

    kv_end = tl.minimum(context + q0 + BLOCK_Q, seq_len)
    offsets = tl.arange(0, BLOCK_SIZE)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_block = 0
    if HAS_WINDOW:  # keys before the first row's window are visible to no row of the tile
        first_block = tl.maximum(context + q0 - window + 1, 0) // BLOCK_SIZE
    for b in range(first_block, tl.cdiv(kv_end, BLOCK_SIZE)):
        block = tl.load(table + b).to(tl.int64)
        k_pos = b * BLOCK_SIZE + offsets
        kv_ok = k_pos < kv_end
        kv_mask = kv_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + block * stride_kb + offsets[:, None] * stride_ks + kv_head * stride_kh
                    + dims[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") if IEEE_DOT else tl.dot(q, tl.trans(k))
        if HAS_SOFTCAP:
            # c * tanh(x / c) with tanh from exp (the interpreter and every backend have exp), in log2 units.
            x = s * (scale_log2 / _LOG2E) / softcap
            e = tl.exp(-2.0 * tl.abs(x))
            t = (1.0 - e) / (1.0 + e)
            s = tl.where(x < 0, -t, t) * (softcap * _LOG2E)
        else:
            s = s * scale_log2
        visible = (k_pos[None, :] <= q_pos[:, None]) & kv_ok[None, :]
        if HAS_WINDOW:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Padding rows see nothing: keep their arithmetic finite.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)

        v = tl.load(v_cache_ptr + block * stride_vb + offsets[:, None] * stride_vs + kv_head * stride_vh
                    + dims[None, :], mask=kv_mask, other=0.0)
        pv = tl.dot(p.to(v.dtype), v, input_precision="ieee") if IEEE_DOT else tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_i[:, None]
    tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def paged_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor, block_tables: torch.Tensor, plan: TilePlan, scale: float,
    sliding_window: int | None = None, logit_softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of ``query`` ``[num_tokens, num_heads, head_dim]`` over the paged KV cache.

    ``k_cache``/``v_cache`` are ``[num_blocks, block_size, num_kv_heads, head_dim]`` and already hold the
    step's new tokens. Returns a new ``[num_tokens, num_heads, head_dim]`` tensor in the query's dtype.
    """
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"queries {tuple(query.shape)} do not fit a cache of {num_kv_heads} KV heads of size {cache_head_dim}"
        )
    if block_size % 16:
        raise ValueError(f"the triton backend needs a block size that is a multiple of 16, got {block_size}")
    if query.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("query and caches must be contiguous in head_dim")
    out = torch.empty_like(query)
    if query.dtype != k_cache.dtype:
        # tl.dot needs one dtype: compute in the cache's, answer in the query's.
        return paged_attention(query.to(k_cache.dtype), k_cache, v_cache, query_start_loc=query_start_loc,
                               seq_lens=seq_lens, block_tables=block_tables, plan=plan, scale=scale,
                               sliding_window=sliding_window, logit_softcap=logit_softcap).to(query.dtype)
    if num_tokens == 0 or plan.num_tiles == 0:
        return out
    group = num_heads // num_kv_heads
    _paged_attention_kernel[(plan.num_tiles, num_kv_heads)](
        query, k_cache, v_cache, out,
        plan.tile_seq, plan.tile_q0, query_start_loc, seq_lens, block_tables,
        scale * _LOG2E, sliding_window or 0, logit_softcap or 1.0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        GROUP=group, GROUP_P=plan.group_padded, BLOCK_Q=plan.block_q,
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_P=max(16, triton.next_power_of_2(head_dim)),
        IEEE_DOT=k_cache.dtype == torch.float32,
        HAS_WINDOW=sliding_window is not None, HAS_SOFTCAP=logit_softcap is not None,
    )
    return out
