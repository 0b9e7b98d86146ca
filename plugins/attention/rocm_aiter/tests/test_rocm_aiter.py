"""The rocm_aiter backend: frame's attention conformance suite and its own checks, against ``aiter``.

On a ROCm machine with AITER the suite runs on the ``rocm`` platform against the real library. Elsewhere it
runs on the ``cpu`` platform against the AITER test double (``aiter_double.py``, installed by conftest.py).
AITER computes in float16/bfloat16 only, so the suite's float32 checks run in float16 here.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention import (
    AttentionBackendSuite,
    build_metadata,
    make_random_batch,
    reference_attention,
    tolerance,
)
from frame_attention_rocm_aiter.backend import AiterAttentionBackend, workspace_bytes
from frame_attention_rocm_aiter.plan import build_plan


def _is_double(module) -> bool:
    return getattr(module, "IS_TEST_DOUBLE", False)


class TestAiterConformance(AttentionBackendSuite):
    plugin_name = "rocm_aiter"
    platform_name = "rocm"
    block_sizes = (16, 32)

    @pytest.fixture(scope="class")
    def platform(self, hooks, aiter_module):
        if not _is_double(aiter_module):
            reason = hooks.platform_check("rocm")
            if reason is not None:
                pytest.skip(f"platform rocm is unavailable: {reason}")
            return hooks.create_platform("rocm", None)
        return hooks.create_platform("cpu", None)  # the double computes on CPU tensors

    def make_backend(self, hooks, platform, num_heads, num_kv_heads, head_dim, dtype=torch.float32, scale=None,
                     **limits):
        # AITER has no float32 kernels: the suite's float32 cases run in float16.
        dtype = torch.float16 if dtype == torch.float32 else dtype
        return super().make_backend(hooks, platform, num_heads, num_kv_heads, head_dim, dtype, scale, **limits)

    def check(self, hooks, platform, seed, num_seqs, block_size, heads, head_dim, dtype=torch.float32, kinds=None,
              **limits):
        dtype = torch.float16 if dtype == torch.float32 else dtype
        super().check(hooks, platform, seed, num_seqs, block_size, heads, head_dim, dtype, kinds, **limits)

    def test_declares_its_platform(self, hooks, platform, aiter_module) -> None:
        assert hooks.attention_platforms(self.plugin_name) == ["rocm"]
        if not _is_double(aiter_module):
            assert hooks.attention_check(self.plugin_name, platform) is None

    def test_single_token_prefill(self, hooks, platform) -> None:
        backend = self.make_backend(hooks, platform, 4, 2, 64)
        meta = build_metadata([0, 3], [1, 1], [[2], [0]], 16, platform.device)
        gen = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(2, h, 64, generator=gen).half().to(platform.device) for h in (4, 2, 2))
        caches = [torch.randn(3, 16, 2, 64, generator=gen).half().to(platform.device) for _ in range(2)]
        expected = reference_attention(q, k, v, *caches, meta, backend.scale)
        meta = backend.build_metadata(meta)
        torch.testing.assert_close(backend.forward(q, k, v, *caches, meta), expected, **tolerance(torch.float16))

    def test_one_metadata_serves_every_layer(self, hooks, platform) -> None:
        backend = self.make_backend(hooks, platform, 6, 2, 64)
        batches = [make_random_batch(11, 4, 16, 6, 2, 64, torch.float16, platform.device,
                                     ["chunk", "decode", "prefill", "decode"]) for _ in range(2)]
        meta = backend.build_metadata(batches[0][-1])
        for layer, (q, k, v, k_cache, v_cache, _) in enumerate(batches):
            q, k = q * (layer + 1), k - layer
            expected = reference_attention(q, k, v, k_cache, v_cache, meta, backend.scale)
            out = backend.forward(q, k, v, k_cache, v_cache, meta)
            torch.testing.assert_close(out, expected, **tolerance(torch.float16))


@pytest.fixture
def hooks() -> PluginHooks:
    return PluginHooks(PluginRegistry())


@pytest.fixture
def rocm_platform(hooks, monkeypatch):
    """The real rocm platform object on a simulated ROCm torch (the check reads only the platform's name)."""
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return hooks.create_platform("rocm", None)


def test_check_accepts_rocm_with_aiter_and_names_what_is_missing(hooks, rocm_platform, monkeypatch):
    cpu = hooks.create_platform("cpu", None)
    assert hooks.attention_check("rocm_aiter", rocm_platform) is None
    assert hooks.attention_check("rocm_aiter", cpu) == (
        "AITER's kernels run on AMD GPUs (the rocm platform), not on the 'cpu' platform")
    monkeypatch.setitem(sys.modules, "aiter", None)
    assert hooks.attention_check("rocm_aiter", rocm_platform) == (
        "the aiter package does not import: import of aiter halted; None in sys.modules")


def test_refuses_what_aiter_cannot_compute():
    with pytest.raises(ValueError, match=r"float16 or bfloat16, not torch\.float32"):
        AiterAttentionBackend(4, 2, 64, 0.125, torch.float32)
    with pytest.raises(ValueError, match="head sizes 64 and 128, not 96"):
        AiterAttentionBackend(4, 2, 96, 0.125, torch.float16)
    backend = AiterAttentionBackend(4, 2, 64, 0.125, torch.float16)
    with pytest.raises(ValueError, match="block sizes 16 and 32, not 8"):
        backend.build_metadata(build_metadata([3], [2], [[0]], 8))


def test_backend_fails_to_create_without_aiter(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter", None)
    with pytest.raises(ImportError):
        AiterAttentionBackend(4, 2, 64, 0.125, torch.float16)


def test_plan_splits_decodes_from_prefills_and_gathers_their_context():
    meta = build_metadata([5, 0, 3, 20], [1, 4, 2, 1], [[3], [0], [2], [4, 5]], 16)
    plan = build_plan(meta)
    assert plan.decode.rows.tolist() == [0, 7] and not plan.decode.all_rows
    assert plan.decode.block_tables.tolist() == [[3, 0], [4, 5]]
    assert plan.decode.context_lens.tolist() == [6, 21] and plan.decode.max_context_len == 21
    assert plan.decode.cu_query_lens.tolist() == [0, 1, 2]
    prefill = plan.prefill
    assert prefill.rows.tolist() == [1, 2, 3, 4, 5, 6]
    assert prefill.cu_seqlens_q.tolist() == [0, 4, 6] and prefill.cu_seqlens_k.tolist() == [0, 4, 9]
    assert (prefill.max_seqlen_q, prefill.max_seqlen_k) == (4, 5)
    assert prefill.kv_slots.tolist() == [0, 1, 2, 3, 32, 33, 34, 35, 36]
    pure = build_plan(build_metadata([4, 9], [1, 1], [[1], [0]], 16))
    assert pure.prefill is None and pure.decode.all_rows


def test_workspace_matches_aiter_partitions():
    # 2 sequences x 4 heads x ceil(300 / 256) = 2 partitions x (64 fp16 values + a float32 max and sum).
    assert workspace_bytes(2, 4, 64, 300, torch.float16) == 2 * 4 * 2 * (64 * 2 + 8)
    assert workspace_bytes(1, 1, 128, 256, torch.bfloat16) == math.ceil(256 / 256) * (128 * 2 + 8)


def test_mixed_step_calls_each_aiter_kernel_once(aiter_module, monkeypatch):
    if not _is_double(aiter_module):
        pytest.skip("counts calls into the test double")
    calls: list[str] = []
    for name in ("reshape_and_cache_flash", "paged_attention_v1", "flash_attn_varlen_func"):
        real = getattr(aiter_module, name)
        monkeypatch.setattr(aiter_module, name, lambda *a, _n=name, _f=real, **kw: (calls.append(_n), _f(*a, **kw))[1])
    backend = AiterAttentionBackend(8, 2, 128, 0.09, torch.bfloat16)
    q, k, v, k_cache, v_cache, meta = make_random_batch(21, 5, 32, 8, 2, 128, torch.bfloat16,
                                                        kinds=["decode", "chunk", "prefill", "decode", "chunk"])
    expected = reference_attention(q, k, v, k_cache, v_cache, meta, 0.09)
    out = backend.forward(q, k, v, k_cache, v_cache, backend.build_metadata(meta))
    assert calls == ["reshape_and_cache_flash", "paged_attention_v1", "flash_attn_varlen_func"]
    torch.testing.assert_close(out, expected, **tolerance(torch.bfloat16))
