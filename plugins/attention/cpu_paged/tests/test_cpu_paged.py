"""The cpu_paged backend: the attention conformance suite, plus the shapes its kernel splits and folds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from frame.interfaces.kv_dtype import dequantize_rows, quantize_rows
from frame.testing.attention import (
    AttentionBackendSuite,
    build_metadata,
    make_batch,
    make_random_batch,
    quantized_kv,
    quantized_tolerance,
    reference_attention,
)
from frame_attention_cpu_paged import kernel
from frame_attention_cpu_paged.backend import CpuPagedAttention

pytestmark = pytest.mark.skipif(kernel.unavailable_reason() is not None,
                                reason=f"the cpu_paged kernel cannot be built here: {kernel.unavailable_reason()}")


class TestCpuPagedConformance(AttentionBackendSuite):
    plugin_name = "cpu_paged"
    head_dims = (64, 128, 256)  # the kernel's three specialised sizes (256: Gemma 2 and 3)


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (14, 2), (8, 8)])
def test_prefills_longer_than_a_tile_and_long_decodes(heads: int, kv_heads: int) -> None:
    # A tile holds 64 // groups query tokens; these prefills span several tiles, one after a cached context,
    # and the decodes read hundreds of keys (many 16-key chunks, the last one partial).
    q, k, v, k_cache, v_cache, meta = make_batch([0, 37, 300, 511, 0], [200, 90, 1, 1, 1], 16, heads, kv_heads, 64)
    backend = CpuPagedAttention(heads, kv_heads, 64, 0.125, torch.float32)
    expected = reference_attention(q, k, v, k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(backend.forward(q, k, v, k_cache, v_cache, meta), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (16, 4, 128), (8, 8, 64), (4, 1, 256)])
def test_bfloat16_cache_with_bfloat16_queries(heads: int, kv_heads: int, dim: int) -> None:
    # On CPUs with AVX-512 BF16 these take the vdpbf16ps path: decodes (partial last chunks, odd key counts),
    # and prefills over several tiles, one after a cached context.
    q, k, v, k_cache, v_cache, meta = make_batch([0, 120, 33, 7, 50], [70, 1, 1, 1, 150], 16, heads, kv_heads, dim,
                                                 seed=1)
    q, k, v, k_cache, v_cache = (t.bfloat16() for t in (q, k, v, k_cache, v_cache))
    out = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.bfloat16).forward(q, k, v, k_cache, v_cache, meta)
    assert out.dtype == torch.bfloat16
    expected = reference_attention(q, k, v, k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


def _bfloat16_matches_the_reference(context: list[int], new: list[int], heads: int, kv_heads: int, dim: int,
                                    seed: int, window: int | None, softcap: float | None) -> None:
    """A bfloat16 batch (blocks of 16, scale 1/8) through the backend matches the reference under the window and
    soft-cap given."""
    q, k, v, k_cache, v_cache, meta = make_batch(context, new, 16, heads, kv_heads, dim, seed=seed)
    q, k, v, k_cache, v_cache = (t.bfloat16() for t in (q, k, v, k_cache, v_cache))
    backend = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.bfloat16, sliding_window=window,
                                logit_softcap=softcap)
    expected = reference_attention(q, k, v, k_cache, v_cache, meta, 0.125, sliding_window=window,
                                   logit_softcap=softcap)
    torch.testing.assert_close(backend.forward(q, k, v, k_cache, v_cache, meta), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 1, 256)])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (100, None), (700, 30.0)])
def test_long_bfloat16_prefills_with_windows_and_softcaps(heads: int, kv_heads: int, dim: int, window: int | None,
                                                          softcap: float | None) -> None:
    # Prompts past 512 tokens take tiles of up to 256 tokens (kVectorTokens) and the sixteen-row softmax steps,
    # whose padding rows, rows before a window's start and rows that see part of a step all fold together: a whole
    # 1,100-token prompt and a 600-token chunk after 300 cached tokens, beside a decode.
    _bfloat16_matches_the_reference([0, 300, 90], [1100, 600, 1], heads, kv_heads, dim, 3, window, softcap)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 1, 256)])
@pytest.mark.parametrize(("window", "softcap"), [(5, None), (20, None), (100, None), (None, 1.5), (20, 30.0)])
def test_bfloat16_windows_and_softcaps_on_the_bfloat16_path(heads: int, kv_heads: int, dim: int, window: int | None,
                                                            softcap: float | None) -> None:
    # The bfloat16 path masks a window and caps the scores itself (Gemma 2/3's local layers, Gemma 2's soft-cap):
    # prefills whose rows' windows start in different 32-key steps, one after a cached context, and decodes over
    # contexts longer and shorter than the window. Scores of about 10 put a cap of 1.5 deep in tanh's flat part.
    _bfloat16_matches_the_reference([0, 120, 33, 7, 50], [70, 1, 1, 1, 150], heads, kv_heads, dim, 2, window, softcap)


def test_odd_head_dim_takes_the_generic_path() -> None:
    q, k, v, k_cache, v_cache, meta = make_random_batch(4, 5, 4, 6, 2, 40)
    out = CpuPagedAttention(6, 2, 40, 0.3, torch.float32).forward(q, k, v, k_cache, v_cache, meta)
    torch.testing.assert_close(out, reference_attention(q, k, v, k_cache, v_cache, meta, 0.3), atol=2e-5, rtol=1e-4)


def test_large_scores_stay_finite() -> None:
    # Scores in the hundreds: the online softmax must rescale, not overflow.
    q, k, v, k_cache, v_cache, meta = make_batch([40, 0], [1, 30], 4, 4, 2, 64, seed=2)
    q = q * 30
    out = CpuPagedAttention(4, 2, 64, 1.0, torch.float32).forward(q, k, v, k_cache, v_cache, meta)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference_attention(q, k, v, k_cache, v_cache, meta, 1.0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128)])
def test_decodes_sharing_prefix_blocks_attend_to_them_together(heads: int, kv_heads: int, dim: int) -> None:
    # Twelve decodes whose block tables start with the same 13 blocks (a cached system prompt), one prefill and
    # one decode on blocks of their own: the bfloat16 path scores the shared keys for all sharers at once
    # (cascade), then each sequence's own keys; the answer must not change.
    contexts, new = [300, 230, 250, 260, 270, 280, 290, 300, 310, 320, 330, 340, 220, 40], [1] * 12 + [1, 60]
    q, k, v, k_cache, v_cache, meta = make_batch(contexts, new, 16, heads, kv_heads, dim, seed=8)
    q, k, v, k_cache, v_cache = (t.bfloat16() for t in (q, k, v, k_cache, v_cache))
    shared = meta.block_tables[0, :13].clone()
    meta.block_tables[1:12, :13] = shared
    backend = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.bfloat16)
    out = backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta)
    torch.testing.assert_close(out, reference_attention(q, k, v, k_cache, v_cache, meta, 0.125), atol=2e-2, rtol=2e-2)
    # The same sequences two at a time (too few sharers for a cascade) give the same answer, to bfloat16 rounding.
    for pair in range(0, 14, 2):
        *_, sub_meta = make_batch(contexts[pair:pair + 2], new[pair:pair + 2], 16, heads, kv_heads, dim)
        rows = slice(sum(new[:pair]), sum(new[:pair + 2]))
        sub_meta.block_tables = meta.block_tables[pair:pair + 2].clone()
        sub_meta.slot_mapping = meta.slot_mapping[rows].clone()
        alone = backend.forward(q[rows], k[rows], v[rows], k_cache.clone(), v_cache.clone(), sub_meta)
        torch.testing.assert_close(alone, out[rows], atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(("dtype", "context", "new", "heads"), [
    (torch.float32, [0, 5, 18], [7, 1, 30], (6, 2)),
    (torch.bfloat16, [0, 5, 18], [7, 1, 30], (6, 2)),
    # A long prefill: on AMX the blocked kernel loads the rest of each sequence's last block as part of a 16-key tile.
    (torch.bfloat16, [0, 100], [1013, 70], (9, 3)),
])
def test_pool_slots_past_each_sequence_never_reach_the_output(dtype: torch.dtype, context: list[int], new: list[int],
                                                              heads: tuple[int, int]) -> None:
    # A pool slot no sequence owns may hold anything, NaN included (freed blocks, torch.empty).
    q, k, v, k_cache, v_cache, meta = make_batch(context, new, 16, *heads, 64, seed=7)
    q, k, v, k_cache, v_cache = (t.to(dtype) for t in (q, k, v, k_cache, v_cache))
    backend = CpuPagedAttention(*heads, 64, 0.125, dtype)
    expected = backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta)
    owned = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for table, length in zip(meta.block_tables.tolist(), meta.seq_lens_host, strict=True):
        for pos in range(length):
            owned[table[pos // 16], pos % 16] = True
    for cache in (k_cache, v_cache):
        cache[~owned] = float("nan")
    assert torch.equal(backend.forward(q, k, v, k_cache, v_cache, meta), expected)


def test_a_batch_answers_the_same_at_any_thread_count() -> None:
    q, k, v, k_cache, v_cache, meta = make_batch([0, 64, 200, 5], [50, 1, 1, 20], 16, 6, 2, 64, seed=3)
    backend = CpuPagedAttention(6, 2, 64, 0.125, torch.float32)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = backend.forward(q, k, v, k_cache, v_cache, meta)
        torch.set_num_threads(2)
        two = backend.forward(q, k, v, k_cache, v_cache, meta)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window", "softcap"),
                         [(9, 3, 64, None, None), (8, 8, 64, None, None), (16, 4, 128, None, None),
                          (9, 3, 64, 20, None), (8, 8, 64, None, 30.0), (4, 2, 80, None, None),
                          (4, 1, 256, None, None), (4, 1, 256, 20, None)])
def test_a_tokens_float32_attention_is_the_same_bits_however_its_step_splits_the_prompt(
        heads: int, kv_heads: int, dim: int, window: int | None, softcap: float | None) -> None:
    # A prefix-cache hit leaves a prompt's last one or two tokens to a step of their own, a decode's token is alone:
    # those rows take the direct path, a prefill's the tile path. Their sums must be the same floats, or a model
    # whose activations are rounded to int8 per block (GGUF's packed kernels) answers identical requests
    # differently (SmolLM2 Q4_1 through frame serve did). A window, a soft-cap or a head size other than 64 and
    # 128 takes the generic loops, which must hold it too.
    tokens, block = 70, 16
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(tokens, n, dim, generator=gen) for n in (heads, kv_heads, kv_heads))
    backend = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.float32, window, softcap)

    def attend(steps: list[int]) -> torch.Tensor:
        k_cache, v_cache = torch.zeros(7, block, kv_heads, dim), torch.zeros(7, block, kv_heads, dim)
        outs, done = [], 0
        for n in steps:
            meta = build_metadata([done], [n], [[4, 1, 6, 0, 2]], block)
            outs.append(backend.forward(q[done:done + n], k[done:done + n], v[done:done + n], k_cache, v_cache, meta))
            done += n
        return torch.cat(outs)

    whole = attend([tokens])
    for steps in ([tokens - 1, 1], [tokens - 2, 2], [32, tokens - 32], [1] * tokens):
        assert torch.equal(attend(steps), whole), steps


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "window", "softcap"),
                         [(9, 3, 64, None, None), (16, 4, 128, None, None), (8, 8, 64, None, None),
                          (4, 1, 256, None, None), (9, 3, 64, 20, None), (4, 1, 256, 50, None), (8, 4, 256, 40, 50.0)])
def test_a_prompt_tokens_bfloat16_attention_is_the_same_bits_however_its_step_splits_the_prompt(
        heads: int, kv_heads: int, dim: int, window: int | None, softcap: float | None) -> None:
    # In bfloat16 the decode path and the prefill path sum in different orders (on AMX on different units), so
    # rows the metadata marks as prompt rows take the prefill path however few they are: a prompt's last one or two
    # tokens after a prefix-cache hit, or one token a step, get the bits the whole prompt gave them. 200 tokens:
    # past the 128 keys from which a lone decode's keys are split over the threads (a prompt row's must not be);
    # the step that ends the prompt also carries four decodes sharing its first blocks (the cascade's minimum).
    tokens, block, others = 200, 16, 4
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(tokens, n, dim, generator=gen).bfloat16() for n in (heads, kv_heads, kv_heads))
    oq, ok, ov = (torch.randn(others, n, dim, generator=gen).bfloat16() for n in (heads, kv_heads, kv_heads))
    backend = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.bfloat16, sliding_window=window,
                                logit_softcap=softcap)
    prompt_table = [3, 17, 9, 0, 12, 5, 14, 1, 10, 7, 2, 16, 4]
    decode_tables = [[*prompt_table[:8], 20 + 2 * i, 21 + 2 * i] for i in range(others)]

    def attend(steps: list[int]) -> torch.Tensor:
        k_cache, v_cache = (torch.randn(28, block, kv_heads, dim, generator=torch.Generator().manual_seed(1)).bfloat16()
                            for _ in range(2))
        outs, done = [], 0
        for i, n in enumerate(steps):
            last = i == len(steps) - 1
            contexts, lens = [done] + [130] * others * last, [n] + [1] * others * last
            tables = [prompt_table] + decode_tables * last
            meta = dataclasses.replace(build_metadata(contexts, lens, tables, block),
                                       prompt=torch.tensor([True] + [False] * others * last))
            qs, ks, vs = (torch.cat([x[done:done + n], *([o] if last else [])]) for x, o in ((q, oq), (k, ok), (v, ov)))
            outs.append(backend.forward(qs, ks, vs, k_cache, v_cache, meta)[:n])
            done += n
        return torch.cat(outs)

    whole = attend([tokens])
    for steps in ([tokens - 1, 1], [tokens - 2, 2], [32, tokens - 32], [16] * (tokens // 16) + [tokens % 16]):
        assert torch.equal(attend(steps), whole), steps


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "context"),
                         [(9, 3, 64, 300), (8, 2, 128, 1000), (6, 2, 64, 100), (4, 1, 256, 700)])
def test_a_lone_decode_split_over_threads_answers_bit_for_bit_as_on_one(heads: int, kv_heads: int, dim: int,
                                                                        context: int) -> None:
    # With fewer sequences than threads the bfloat16 path sweeps a decode's keys before its last 32-key steps one
    # KV head per thread, then resumes the item from that state: the same steps, so the same bits. 100 keys: too
    # few to split; the answer is the same either way.
    q, k, v, k_cache, v_cache, meta = make_batch([context], [1], 16, heads, kv_heads, dim, seed=9)
    q, k, v, k_cache, v_cache = (t.bfloat16() for t in (q, k, v, k_cache, v_cache))
    backend = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta)
        torch.set_num_threads(2)
        two = backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    expected = reference_attention(q, k, v, k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(two, expected, atol=2e-2, rtol=2e-2)


def test_forward_writes_the_same_slots_as_write_kv() -> None:
    q, k, v, k_cache, v_cache, meta = make_batch([0, 20, 70], [33, 1, 5], 16, 6, 2, 64, seed=4)
    backend = CpuPagedAttention(6, 2, 64, 0.125, torch.float32)
    by_forward = (k_cache.clone(), v_cache.clone())
    backend.forward(q, k, v, *by_forward, meta)
    backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    assert torch.equal(by_forward[0], k_cache) and torch.equal(by_forward[1], v_cache)


def test_a_slot_outside_the_cache_is_refused() -> None:
    q, k, v, k_cache, v_cache, meta = make_batch([0], [3], 4, 2, 1, 64, seed=5)
    meta.slot_mapping[1] = k_cache.shape[0] * k_cache.shape[1]
    with pytest.raises(RuntimeError, match="outside the cache"):
        CpuPagedAttention(2, 1, 64, 0.125, torch.float32).forward(q, k, v, k_cache, v_cache, meta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_qkv_columns_give_the_contiguous_answer(dtype: torch.dtype) -> None:
    # What a model with a fused QKV projection passes: column slices, each token's heads contiguous.
    q, k, v, k_cache, v_cache, meta = make_batch([0, 40, 100], [30, 1, 1], 16, 6, 2, 64, seed=6)
    q, k, v, k_cache, v_cache = (t.to(dtype) for t in (q, k, v, k_cache, v_cache))
    tokens = q.shape[0]
    qkv = torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)], dim=1)
    views = (qkv[:, :384].view(tokens, 6, 64), qkv[:, 384:512].view(tokens, 2, 64), qkv[:, 512:].view(tokens, 2, 64))
    assert not views[0].is_contiguous()
    backend = CpuPagedAttention(6, 2, 64, 0.125, dtype)
    strided_caches = (k_cache.clone(), v_cache.clone())
    got = backend.forward(*views, *strided_caches, meta)
    expected = backend.forward(q, k, v, k_cache, v_cache, meta)
    assert torch.equal(got, expected)
    assert torch.equal(strided_caches[0], k_cache) and torch.equal(strided_caches[1], v_cache)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128)])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (40, None), (None, 30.0)])
def test_quantized_prefills_with_bfloat16_queries(kv_dtype: torch.dtype, heads: int, kv_heads: int, dim: int,
                                                   window: int | None, softcap: float | None) -> None:
    # Long prefills (one after a cached context) with a decode beside them: on CPUs with AVX-512 BF16 such a step
    # dequantizes the blocks it reads once (with a window, those from each sequence's first window on) and attends
    # on the bfloat16 path; elsewhere the float path widens them.
    q, k, v, k_cache, v_cache, meta = make_batch([0, 70, 300], [250, 130, 1], 16, heads, kv_heads, dim, seed=5)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    k_q, v_q, kc_q, vc_q = quantized_kv(k, v, k_cache, v_cache, kv_dtype)
    limits = {"sliding_window": window, "logit_softcap": softcap}
    out = CpuPagedAttention(heads, kv_heads, dim, 0.125, torch.bfloat16, **limits).forward(q, k, v, kc_q, vc_q, meta)
    expected = reference_attention(q, k_q, v_q, dequantize_rows(kc_q, torch.float32),
                                   dequantize_rows(vc_q, torch.float32), meta, 0.125, **limits)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    float_kv = reference_attention(q, k, v, k_cache, v_cache, meta, 0.125, **limits)
    torch.testing.assert_close(out.float(), float_kv.float(), **quantized_tolerance(kv_dtype, torch.bfloat16))


def test_every_finite_fp8_code_is_read_exactly() -> None:
    # One key per sequence, so each output row is its V row: the kernel's fp8 widening must give torch's value for
    # each of the 254 finite e4m3 codes (subnormals included), times the row's scale.
    codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)] + [0, 0], dtype=torch.uint8).view(4, 64)
    v_cache = torch.empty(4, 16, 1, 64 + 4, dtype=torch.float8_e4m3fn)
    v_cache.view(torch.uint8)[:, 0, 0, :64] = codes
    v_cache[:, 0, 0, 64:] = torch.full((4, 1), 0.5).view(torch.float8_e4m3fn)  # each row's scale
    k_cache = quantize_rows(torch.ones(4, 16, 1, 64), torch.float8_e4m3fn)
    meta = build_metadata([0] * 4, [1] * 4, [[b] for b in range(4)], 16)
    out = CpuPagedAttention(1, 1, 64, 0.125, torch.float32).attend(torch.randn(4, 1, 64), k_cache, v_cache, meta)
    assert torch.equal(out[:, 0], codes.view(torch.float8_e4m3fn).float() * 0.5)
