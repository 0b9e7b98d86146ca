"""The sdpa backend: the attention conformance suite plus checks of its own gather plan."""

from __future__ import annotations

import torch
from frame.testing.attention import AttentionBackendSuite, build_metadata, make_random_batch, reference_attention
from frame_attention_sdpa.backend import SdpaAttention
from frame_attention_sdpa.plan import build_plan


class TestSdpaConformance(AttentionBackendSuite):
    plugin_name = "sdpa"


def test_plan_splits_decodes_from_prefills() -> None:
    meta = build_metadata([5, 0, 3, 9], [1, 4, 2, 1], [[3, 1], [0], [2, 7], [4, 5, 6]], 4)
    plan = build_plan(meta)
    assert len(plan.decodes) == 1
    decode = plan.decodes[0]
    # Longest first. Sequence 3: 10 positions over 4, 5, 6; sequence 0: 6 over blocks 3, 1 (padded with 0).
    assert decode.rows.tolist() == [7, 0]
    assert decode.num_blocks == 3
    assert decode.blocks.tolist() == [4, 5, 6, 3, 1, 0]
    assert decode.mask[:, 0].sum(dim=1).tolist() == [10, 6]
    assert decode.bias(torch.float32)[1, 0, 5:7].tolist() == [0.0, float("-inf")]
    assert [(p.start, p.query_len, p.mask is None) for p in plan.prefills] == [(1, 4, True), (5, 2, False)]
    # The chunk's second new token (position 4) sees positions 0..4 only.
    assert plan.prefills[1].mask[1].tolist() == [True] * 5


def test_attend_plans_for_itself_given_the_common_metadata() -> None:
    backend = SdpaAttention(4, 2, 64, 0.125, torch.float32)
    q, k, v, k_cache, v_cache, meta = make_random_batch(3, 4, 16, 4, 2, 64)
    out = backend.forward(q, k, v, k_cache, v_cache, meta)
    torch.testing.assert_close(out, reference_attention(q, k, v, k_cache, v_cache, meta, 0.125), atol=2e-5, rtol=1e-4)


def test_bfloat16_cache_with_float32_queries() -> None:
    backend = SdpaAttention(6, 2, 64, 0.125, torch.bfloat16)
    q, k, v, k_cache, v_cache, meta = make_random_batch(4, 3, 8, 6, 2, 64, kinds=["decode", "chunk", "prefill"])
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    out = backend.forward(q, k, v, k_cache, v_cache, meta)
    assert out.dtype == torch.float32
    expected = reference_attention(q, k.bfloat16(), v.bfloat16(), k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(out, expected, atol=3e-2, rtol=3e-2)


def test_decode_buckets_by_length() -> None:
    lens = list(range(1, 41))
    meta = build_metadata(lens, [1] * 40, [[i] * 3 for i in range(40)], 16)
    plan = build_plan(meta)
    assert [g.rows.numel() for g in plan.decodes] == [20, 20]
    assert [g.num_blocks for g in plan.decodes] == [3, 2]
    assert sorted(r for g in plan.decodes for r in g.rows.tolist()) == list(range(40))


def test_many_kv_heads_take_the_sdpa_decode_path() -> None:
    backend = SdpaAttention(12, 12, 32, 0.2, torch.float32)
    q, k, v, k_cache, v_cache, meta = make_random_batch(5, 6, 8, 12, 12, 32, kinds=["decode"] * 5 + ["chunk"])
    out = backend.forward(q, k, v, k_cache, v_cache, meta)
    torch.testing.assert_close(out, reference_attention(q, k, v, k_cache, v_cache, meta, 0.2), atol=2e-5, rtol=1e-4)
