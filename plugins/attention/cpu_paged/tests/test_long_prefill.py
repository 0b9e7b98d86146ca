"""Long prefills through cpu_paged against a float32 reference: whole prompts, chunks that start mid-sequence, GQA.

On a CPU with AMX a bfloat16 prefill runs the blocked kernel of ``csrc/amx_prefill.h``; elsewhere, and with
``FRAME_CPU_DISABLE`` taking flags away (``amx_tile``: the vdpbf16ps tiles; ``avx512_bf16``: the AVX-512 float
loops; ``avx512f``: the AVX2 loops), the same tests check that class's path on this machine.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from frame.interfaces.kv_dtype import dequantize_rows
from frame.testing.attention import build_metadata, make_batch, quantized_kv
from frame_attention_cpu_paged import kernel
from frame_attention_cpu_paged.backend import CpuPagedAttention

pytestmark = pytest.mark.skipif(kernel.unavailable_reason() is not None,
                                reason=f"the cpu_paged kernel cannot be built here: {kernel.unavailable_reason()}")


def float32_reference(query, k_cache, v_cache, meta, scale: float) -> torch.Tensor:
    """Causal attention in float32, one sequence at a time as whole matrices (the float64 conformance reference
    goes a token at a time, too slow for thousands of tokens): K/V gathered through the block table."""
    block_size, kv_heads, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    heads = query.shape[1]
    starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    out = []
    for s, length in enumerate(lens):
        new = starts[s + 1] - starts[s]
        table = meta.block_tables[s]
        slots = torch.tensor([int(table[p // block_size]) * block_size + p % block_size for p in range(length)])
        keys = k_cache.reshape(-1, kv_heads, dim)[slots].float().repeat_interleave(heads // kv_heads, 1)
        values = v_cache.reshape(-1, kv_heads, dim)[slots].float().repeat_interleave(heads // kv_heads, 1)
        scores = torch.einsum("thd,khd->htk", query[starts[s]:starts[s + 1]].float(), keys) * scale
        positions = torch.arange(length - new, length)[:, None]
        scores = scores.masked_fill(torch.arange(length)[None, :] > positions, float("-inf"))
        out.append(torch.einsum("htk,khd->thd", scores.softmax(-1), values))
    return torch.cat(out)


def bfloat16_step(context: list[int], new: list[int], block_size: int, heads: int, kv_heads: int, dim: int,
                  seed: int = 11):
    q, k, v, k_cache, v_cache, meta = make_batch(context, new, block_size, heads, kv_heads, dim, seed=seed)
    return (*(t.bfloat16() for t in (q, k, v, k_cache, v_cache)), meta)


@pytest.mark.parametrize(("context", "new", "heads", "kv_heads", "dim", "block_size"), [
    ([0], [2000], 9, 3, 64, 16),               # SmolLM2's heads, a whole 2,000-token prompt
    ([1500], [512], 9, 3, 64, 16),             # a chunk that starts mid-sequence
    ([0, 700], [333, 130], 14, 2, 64, 32),     # GQA 7:1, blocks of 32, a prompt and a chunk together
    ([250], [900], 16, 4, 128, 16),            # head size 128: O^T does not fit the tiles, it stays in memory
    ([0, 40], [1000, 1], 8, 8, 64, 16),        # no grouping, a decode beside the prefill
])
def test_long_prefills_match_float32(context, new, heads, kv_heads, dim, block_size) -> None:
    q, k, v, k_cache, v_cache, meta = bfloat16_step(context, new, block_size, heads, kv_heads, dim)
    backend = CpuPagedAttention(heads, kv_heads, dim, dim**-0.5, torch.bfloat16)
    out = backend.forward(q, k, v, k_cache, v_cache, meta)
    expected = float32_reference(q, k_cache, v_cache, meta, dim**-0.5)
    # bfloat16 probabilities and output: each output's error stays within a few of its own rounding steps.
    torch.testing.assert_close(out.float(), expected, atol=1.5e-2, rtol=2e-2)


def test_scores_that_climb_along_the_prompt_rescale_without_overflow() -> None:
    # Queries and keys growing with position make each row's maximum rise step after step by far more than the
    # kernel's lazy-rescale margin (2^8): every rise must rescale the running sums, not overflow them.
    q, k, v, k_cache, v_cache, meta = bfloat16_step([0], [600], 16, 4, 2, 64, seed=12)
    ramp = torch.linspace(0.2, 6.0, 600)[:, None, None]
    q, k = (q.float() * ramp).bfloat16(), (k.float() * ramp).bfloat16()
    backend = CpuPagedAttention(4, 2, 64, 1.0, torch.bfloat16)
    out = backend.forward(q, k, v, k_cache, v_cache, meta)
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), float32_reference(q, k_cache, v_cache, meta, 1.0), atol=2e-2, rtol=2e-2)


def test_rows_that_rescale_and_rows_that_do_not_keep_their_bits_however_the_prompt_is_split() -> None:
    # The blocked kernel skips its max pass unless some row of a 16-row block may have passed its reference
    # maximum; then the block takes the max pass and only the rows that rise change. Here every fifth token's
    # queries climb (their rows rise again and again, well past the 2^8 margin) while the others stay flat, over
    # 700 tokens (two 512-key steps): splitting the prompt into other steps puts other rows beside them in each block
    # and in each item, and every row must still get the bits the whole prompt gave it.
    tokens, block, heads, kv_heads, dim = 700, 16, 9, 3, 64
    gen = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(tokens, n, dim, generator=gen) for n in (heads, kv_heads, kv_heads))
    climb = torch.ones(tokens, 1, 1)
    climb[::5] = torch.linspace(1.0, 40.0, tokens)[::5, None, None]
    q, k, v = (q * climb).bfloat16(), (k * torch.linspace(0.5, 3.0, tokens)[:, None, None]).bfloat16(), v.bfloat16()
    table = torch.randperm(48, generator=gen)[:(tokens + block - 1) // block].tolist()
    backend = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.bfloat16)

    def attend(steps: list[int]) -> torch.Tensor:
        k_cache, v_cache = (torch.zeros(48, block, kv_heads, dim, dtype=torch.bfloat16) for _ in range(2))
        outs, done = [], 0
        for n in steps:
            meta = dataclasses.replace(build_metadata([done], [n], [table], block), prompt=torch.tensor([True]))
            outs.append(backend.forward(q[done:done + n], k[done:done + n], v[done:done + n], k_cache, v_cache, meta))
            done += n
        return torch.cat(outs)

    whole = attend([tokens])
    assert torch.isfinite(whole.float()).all()
    for steps in ([1, tokens - 1], [7, 300, tokens - 307], [333, tokens - 333]):
        assert torch.equal(attend(steps), whole), steps


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
def test_long_prefill_over_a_quantized_pool(kv_dtype: torch.dtype) -> None:
    # An int8 / fp8 pool: on CPUs with AVX-512 BF16 the step's blocks are widened once to bfloat16 and attended by
    # the bfloat16 path (the blocked kernel on AMX); the answer is the float32 one over the dequantized KV.
    q, k, v, k_cache, v_cache, meta = bfloat16_step([800], [1200], 16, 9, 3, 64, seed=14)
    _, _, kc_q, vc_q = quantized_kv(k, v, k_cache.float(), v_cache.float(), kv_dtype)
    out = CpuPagedAttention(9, 3, 64, 0.125, torch.bfloat16).forward(q, k, v, kc_q, vc_q, meta)
    expected = float32_reference(q, dequantize_rows(kc_q, torch.float32), dequantize_rows(vc_q, torch.float32), meta,
                                 0.125)
    torch.testing.assert_close(out.float(), expected, atol=1.5e-2, rtol=2e-2)
