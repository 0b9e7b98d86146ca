"""Conformance checks on what a backend may read from the KV pool: only slots that were written.

A pool is ``torch.empty``: a slot no sequence has written yet (the tail of a sequence's last block, a free block a
padded block table points at) holds whatever the memory held before, NaN and infinity included. A backend that
gathers whole blocks must keep those slots out of its sums: a masked score of NaN stays NaN after adding ``-inf``,
and a zero probability times a NaN value is NaN. :class:`UnwrittenSlotChecks` poisons every unwritten slot and
asks for the reference's answer; :class:`frame.testing.attention.AttentionBackendSuite` includes it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from frame.interfaces.kv_dtype import KV_CACHE_DTYPES, is_quantized, read_rows
from frame.interfaces.kv_layout import slots_of
from frame.testing.attention_reference import make_random_batch, quantized_kv, reference_attention, tolerance


def written_slots(meta, num_slots: int) -> torch.Tensor:
    """``[num_slots]`` bool: True at the slots of positions ``0..seq_len-1`` of every sequence of ``meta`` (its
    cached context and this step's new tokens)."""
    written = torch.zeros(num_slots, dtype=torch.bool)
    tables = meta.block_tables.cpu().numpy()
    for i, seq_len in enumerate(meta.seq_lens_host):
        written[torch.from_numpy(slots_of(tables[i], np.arange(seq_len), meta.block_size))] = True
    return written


def poison_unwritten(cache: torch.Tensor, written: torch.Tensor) -> None:
    """Fill the unwritten slots of a per-layer cache ``[blocks, block_size, kv_heads, width]``: NaN in a float
    pool, all-ones bytes (code -1, a NaN scale) in a quantized one."""
    rows = cache.view(-1, *cache.shape[2:])
    unwritten = (~written).to(cache.device)
    if is_quantized(cache.dtype):
        rows.view(torch.uint8)[unwritten] = 0xFF
    else:
        rows[unwritten] = float("nan")


class UnwrittenSlotChecks:
    """Mixed into the attention suite: garbage in slots a step does not own never reaches its output."""

    @pytest.mark.parametrize("kv_dtype", ["float", "int8", "fp8"])
    def test_unwritten_slots_never_reach_the_output(self, hooks, platform, kv_dtype: str) -> None:
        pool_dtype = KV_CACHE_DTYPES.get(kv_dtype)
        if pool_dtype is not None and kv_dtype not in hooks.attention_kv_dtypes(self.plugin_name):
            pytest.skip(f"{self.plugin_name} does not read a {kv_dtype} KV cache")
        backend = self.make_backend(hooks, platform, 6, 2, 64)
        # Decodes of different lengths share one padded group; a chunk and a prefill read their own slots.
        q, k, v, k_cache, v_cache, meta = make_random_batch(
            11, 6, self.block_sizes[-2], 6, 2, 64, backend.dtype, platform.device,
            kinds=["decode", "prefill", "decode", "chunk", "decode", "decode"])
        if pool_dtype is not None:
            k, v, k_cache, v_cache = quantized_kv(k, v, k_cache, v_cache, pool_dtype)
        expected = reference_attention(q, k, v, read_rows(k_cache, torch.float32), read_rows(v_cache, torch.float32),
                                       meta, backend.scale)
        written = written_slots(meta, k_cache.shape[0] * k_cache.shape[1])
        for cache in (k_cache, v_cache):
            poison_unwritten(cache, written)
        out = backend.forward(q, k, v, k_cache, v_cache, backend.build_metadata(meta))
        assert torch.isfinite(out).all(), "garbage in an unwritten KV slot reached the output"
        torch.testing.assert_close(out, expected, **tolerance(backend.dtype))
