"""Test setup of the triton plugin: the Triton interpreter on machines without a GPU, and paged-batch helpers.

When no CUDA or ROCm device is visible, ``TRITON_INTERPRET=1`` must be set when the kernels are decorated (at
the first import of ``frame_attention_triton.kv_write`` and ``.paged_attention``) and while they run. So this
conftest imports them with the variable set, and an autouse fixture sets it for every test of this folder;
the variable never leaks into other plugins' tests of the same pytest run. Interpreted kernels take CPU tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from frame.interfaces.attention import AttentionMetadata
from frame.interfaces.kv_layout import step_metadata

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_GPU else "cpu")

if not HAS_GPU:
    with pytest.MonkeyPatch.context() as _patch:
        _patch.setenv("TRITON_INTERPRET", "1")
        import frame_attention_triton.kv_write
        import frame_attention_triton.paged_attention  # noqa: F401 - decorated as interpreted kernels


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    """Run this folder's tests under the Triton interpreter when there is no GPU."""
    if not HAS_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@dataclass
class PagedBatch:
    """A random step: queries and new K/V, a KV pool holding random context, and the step's metadata."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    meta: AttentionMetadata


def make_batch(
    specs: list[tuple[int, int]], *, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
    dtype: torch.dtype, seed: int, device: torch.device = DEVICE, spare_blocks: int = 3,
) -> PagedBatch:
    """A batch of sequences given as ``(cached tokens, new tokens)``; blocks are shuffled over the pool.

    The pool is filled with random values everywhere, so a kernel that reads a wrong slot gets a wrong answer.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in specs]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks = max(blocks_per_seq) + 1
    tables = torch.zeros(len(specs), max_blocks, dtype=torch.int32)
    slots: list[int] = []
    used = 0
    for i, ((c, q), n) in enumerate(zip(specs, blocks_per_seq, strict=True)):
        tables[i, :n] = torch.tensor(order[used:used + n], dtype=torch.int32)
        used += n
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size for p in range(c, c + q)]
    query_lens = [q for _, q in specs]
    num_tokens = sum(query_lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    meta = step_metadata(np.asarray(query_lens), np.asarray(seq_lens), tables.numpy(),
                         np.asarray(slots, dtype=np.int64), block_size, device)
    return PagedBatch(
        query=rand(num_tokens, num_heads, head_dim), key=rand(num_tokens, num_kv_heads, head_dim),
        value=rand(num_tokens, num_kv_heads, head_dim),
        k_cache=rand(num_blocks, block_size, num_kv_heads, head_dim),
        v_cache=rand(num_blocks, block_size, num_kv_heads, head_dim), meta=meta,
    )


def reference_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Causal paged attention in float64, one sequence at a time, reading K/V through the block tables."""
    num_heads = query.shape[1]
    block_size = k_cache.shape[1]
    out = torch.empty(query.shape, dtype=torch.float64)
    starts = meta.query_start_loc.tolist()
    for i, (q_len, seq_len) in enumerate(zip(meta.query_lens, meta.seq_lens_host, strict=True)):
        pos = torch.arange(seq_len)
        blocks = meta.block_tables[i].cpu().long()[pos // block_size]
        keys = k_cache.cpu().double()[blocks, pos % block_size]  # [seq_len, Hkv, D]
        values = v_cache.cpu().double()[blocks, pos % block_size]
        group = num_heads // keys.shape[1]
        keys = keys.repeat_interleave(group, dim=1)
        values = values.repeat_interleave(group, dim=1)
        q = query[starts[i]:starts[i + 1]].cpu().double()  # [q_len, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, keys) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len)
        scores = scores.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[starts[i]:starts[i + 1]] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
    return out


def require_gpu() -> None:
    """Skip the calling test unless a CUDA or ROCm device is visible."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA or ROCm device")


@pytest.fixture
def paged_batch():
    """The :func:`make_batch` factory."""
    return make_batch


@pytest.fixture
def reference():
    """The :func:`reference_attention` function."""
    return reference_attention
