"""Conformance suite of attention backends, with the batch builders and the reference it checks against.

A backend's tests subclass :class:`AttentionBackendSuite` and set ``plugin_name`` (and ``platform_name`` when the
backend does not run on the CPU). Every check compares the backend with :func:`reference_attention`, a slow
per-sequence, per-token loop in float64 that reads cached context through the block table and the step's new
keys straight from the inputs, so a backend that writes KV to the wrong slot cannot agree with it.

The builders are public for backends' own tests: :func:`build_metadata` makes exact metadata for given block
tables, :func:`make_random_batch` a seeded random batch mixing prefills, prefill chunks and decodes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import ClassVar

import pytest
import torch

from frame.interfaces.attention import AttentionBackend, AttentionMetadata, UnsupportedAttentionError
from frame.interfaces.kv_dtype import KV_CACHE_DTYPES, dequantize_rows, is_quantized, quantize_rows
from frame.interfaces.platform import Platform
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention_pool import UnwrittenSlotChecks
from frame.testing.attention_reference import (
    KINDS,
    QUANTIZED_TOLERANCE,
    build_metadata,
    make_batch,
    make_random_batch,
    quantized_kv,
    quantized_tolerance,
    reference_attention,
    tolerance,
)

__all__ = ["KINDS", "QUANTIZED_TOLERANCE", "AttentionBackendSuite", "build_metadata", "make_batch",
           "make_random_batch", "quantized_kv", "quantized_tolerance", "reference_attention", "tolerance"]

class AttentionBackendSuite(UnwrittenSlotChecks):
    """Subclass with ``plugin_name = "<backend>"`` (and ``platform_name`` if not ``cpu``) to run the suite.

    The backend is created through the plugin's ``frame_attention_create`` hook on the named platform; the suite
    is skipped when that platform cannot run here. Override :attr:`block_sizes` for a backend limited to some.
    """

    plugin_name: ClassVar[str]
    platform_name: ClassVar[str] = "cpu"
    block_sizes: ClassVar[tuple[int, ...]] = (1, 4, 16, 32)
    head_dims: ClassVar[tuple[int, ...]] = (64, 128)
    #: (num_heads, num_kv_heads): multi-head, grouped-query and multi-query attention.
    head_layouts: ClassVar[tuple[tuple[int, int], ...]] = ((4, 4), (6, 2), (8, 1))

    @pytest.fixture(scope="class")
    def hooks(self) -> PluginHooks:
        return PluginHooks(PluginRegistry())

    @pytest.fixture(scope="class")
    def platform(self, hooks: PluginHooks) -> Platform:
        reason = hooks.platform_check(self.platform_name)
        if reason is not None:
            pytest.skip(f"platform {self.platform_name} is unavailable: {reason}")
        options_model = hooks.options_model("platform", self.platform_name)
        platform = hooks.create_platform(self.platform_name, options_model() if options_model else None)
        platform.name = self.platform_name
        return platform

    def make_backend(
        self, hooks: PluginHooks, platform: Platform, num_heads: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype = torch.float32, scale: float | None = None, sliding_window: int | None = None,
        logit_softcap: float | None = None,
    ) -> AttentionBackend:
        """The backend under test, created through its hook with its default options."""
        options_model = hooks.options_model("attention", self.plugin_name)
        return hooks.create_attention(
            self.plugin_name, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            scale=scale if scale is not None else 1.3 / math.sqrt(head_dim), dtype=dtype, platform=platform,
            options=options_model() if options_model else None, sliding_window=sliding_window,
            logit_softcap=logit_softcap,
        )

    def make_limited_backend(self, hooks: PluginHooks, platform: Platform, heads: tuple[int, int], head_dim: int,
                             sliding_window: int | None = None, logit_softcap: float | None = None,
                             dtype: torch.dtype = torch.float32) -> AttentionBackend:
        """A backend with a window and/or soft-cap; skips the test when the backend refuses them or its hook does
        not pass them on (the engine then refuses it for such layers). What it must not do is report a window or
        soft-cap and ignore it, which the checks catch."""
        try:
            backend = self.make_backend(hooks, platform, heads[0], heads[1], head_dim, dtype,
                                        sliding_window=sliding_window, logit_softcap=logit_softcap)
        except UnsupportedAttentionError as err:
            pytest.skip(f"{self.plugin_name} refuses it: {err}")
        if (getattr(backend, "sliding_window", None), getattr(backend, "logit_softcap", None)) != (
                sliding_window, logit_softcap):
            pytest.skip(f"{self.plugin_name}'s frame_attention_create does not pass sliding_window and logit_softcap "
                        "on, so the engine refuses it for layers that need them")
        return backend

    def check(self, hooks, platform, seed: int, num_seqs: int, block_size: int, heads: tuple[int, int],
              head_dim: int, dtype: torch.dtype = torch.float32, kinds: Sequence[str] | None = None,
              sliding_window: int | None = None, logit_softcap: float | None = None) -> None:
        """Run one random step through the backend and compare output and caches with the reference."""
        if sliding_window is None and logit_softcap is None:
            backend = self.make_backend(hooks, platform, heads[0], heads[1], head_dim, dtype)
        else:
            backend = self.make_limited_backend(hooks, platform, heads, head_dim, sliding_window, logit_softcap,
                                                dtype)
        q, k, v, k_cache, v_cache, meta = make_random_batch(
            seed, num_seqs, block_size, heads[0], heads[1], head_dim, dtype, platform.device, kinds
        )
        expected = reference_attention(q, k, v, k_cache, v_cache, meta, backend.scale, sliding_window, logit_softcap)
        out = backend.forward(q, k, v, k_cache, v_cache, backend.build_metadata(meta))
        assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
        torch.testing.assert_close(out, expected, **tolerance(dtype))

    # -- the plugin's declarations ---------------------------------------------------------------------
    def test_declares_its_platform(self, hooks: PluginHooks, platform: Platform) -> None:
        platforms = hooks.attention_platforms(self.plugin_name)
        assert self.platform_name in platforms and all(isinstance(p, str) for p in platforms)
        assert hooks.attention_check(self.plugin_name, platform) is None

    def test_rejects_heads_that_do_not_group(self, hooks: PluginHooks, platform: Platform) -> None:
        with pytest.raises(ValueError, match="cannot be grouped"):
            self.make_backend(hooks, platform, 6, 4, 64)

    # -- write_kv ---------------------------------------------------------------------------------------
    @pytest.mark.parametrize("block_size", [1, 4, 16, 32])
    def test_write_kv_fills_exactly_the_mapped_slots(self, hooks, platform, block_size: int) -> None:
        if block_size not in self.block_sizes:
            pytest.skip(f"block size {block_size} is not supported by {self.plugin_name}")
        backend = self.make_backend(hooks, platform, 4, 2, 64)
        _, k, v, k_cache, v_cache, meta = make_random_batch(block_size, 5, block_size, 4, 2, 64,
                                                            device=platform.device)
        before_k, before_v = k_cache.clone(), v_cache.clone()
        backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        flat_k, flat_v = k_cache.view(-1, 2, 64), v_cache.view(-1, 2, 64)
        for token, slot in enumerate(meta.slot_mapping.tolist()):
            assert torch.equal(flat_k[slot], k[token]) and torch.equal(flat_v[slot], v[token]), f"slot {slot}"
        untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=flat_k.device)
        untouched[meta.slot_mapping] = False
        assert torch.equal(flat_k[untouched], before_k.view(-1, 2, 64)[untouched])
        assert torch.equal(flat_v[untouched], before_v.view(-1, 2, 64)[untouched])

    # -- attention against the reference ----------------------------------------------------------------
    @pytest.mark.parametrize("block_size", [1, 4, 16, 32])
    @pytest.mark.parametrize("layout", [0, 1, 2])
    def test_mixed_batch_matches_reference(self, hooks, platform, block_size: int, layout: int) -> None:
        if block_size not in self.block_sizes:
            pytest.skip(f"block size {block_size} is not supported by {self.plugin_name}")
        self.check(hooks, platform, 100 * block_size + layout, 6, block_size, self.head_layouts[layout],
                   self.head_dims[0], kinds=["prefill", "decode", "chunk", "decode", "chunk", "prefill"])

    @pytest.mark.parametrize("seed", range(4))
    def test_random_batches_match_reference(self, hooks, platform, seed: int) -> None:
        rng = random.Random(seed)
        self.check(hooks, platform, seed, rng.randint(1, 7), rng.choice(self.block_sizes),
                   rng.choice(self.head_layouts), rng.choice(self.head_dims))

    @pytest.mark.parametrize("kind", KINDS)
    def test_uniform_batches_match_reference(self, hooks, platform, kind: str) -> None:
        self.check(hooks, platform, 7, 5, self.block_sizes[-1], self.head_layouts[1], self.head_dims[-1],
                   kinds=[kind] * 5)

    def test_single_token_prefill(self, hooks, platform) -> None:
        backend = self.make_backend(hooks, platform, 4, 2, 64)
        meta = build_metadata([0, 3], [1, 1], [[2], [0]], self.block_sizes[-1], platform.device)
        gen = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(2, h, 64, generator=gen).to(platform.device) for h in (4, 2, 2))
        caches = [torch.randn(3, self.block_sizes[-1], 2, 64, generator=gen).to(platform.device) for _ in range(2)]
        expected = reference_attention(q, k, v, *caches, meta, backend.scale)
        meta = backend.build_metadata(meta)
        torch.testing.assert_close(backend.forward(q, k, v, *caches, meta), expected, **tolerance(torch.float32))

    def test_one_metadata_serves_every_layer(self, hooks, platform) -> None:
        backend = self.make_backend(hooks, platform, 6, 2, 64)
        batches = [make_random_batch(11, 4, self.block_sizes[1], 6, 2, 64, device=platform.device,
                                     kinds=["chunk", "decode", "prefill", "decode"]) for _ in range(2)]
        meta = backend.build_metadata(batches[0][-1])
        assert isinstance(meta, AttentionMetadata) and meta.num_seqs == 4
        for layer, (q, k, v, k_cache, v_cache, _) in enumerate(batches):
            q, k = q * (layer + 1), k - layer  # layers differ in data, never in metadata
            expected = reference_attention(q, k, v, k_cache, v_cache, meta, backend.scale)
            out = backend.forward(q, k, v, k_cache, v_cache, meta)
            torch.testing.assert_close(out, expected, **tolerance(torch.float32))

    # -- sliding windows and logit soft-caps (plugin API 2, issue 18) --------------------------------------------
    @pytest.mark.parametrize("window", [1, 5, 16])
    def test_sliding_window_matches_reference(self, hooks, platform, window: int) -> None:
        self.check(hooks, platform, 40 + window, 6, self.block_sizes[1], self.head_layouts[1], self.head_dims[0],
                   kinds=["prefill", "decode", "chunk", "decode", "chunk", "prefill"], sliding_window=window)

    @pytest.mark.parametrize("kind", KINDS)
    def test_sliding_window_in_uniform_batches(self, hooks, platform, kind: str) -> None:
        self.check(hooks, platform, 9, 5, self.block_sizes[-1], self.head_layouts[2], self.head_dims[-1],
                   kinds=[kind] * 5, sliding_window=7)

    def test_logit_softcap_matches_reference(self, hooks, platform) -> None:
        self.check(hooks, platform, 21, 6, self.block_sizes[1], self.head_layouts[1], self.head_dims[0],
                   kinds=["prefill", "decode", "chunk", "decode", "chunk", "prefill"], logit_softcap=1.5)

    def test_window_and_softcap_together(self, hooks, platform) -> None:
        for seed, layout in ((22, 0), (23, 2)):
            self.check(hooks, platform, seed, 5, self.block_sizes[-2], self.head_layouts[layout], self.head_dims[-1],
                       sliding_window=6, logit_softcap=2.0)

    def test_plain_metadata_serves_windowed_layers(self, hooks, platform) -> None:
        """The runner builds a step's metadata through the first layer's backend; a windowed, soft-capped layer of
        the same plugin must attend correctly with it."""
        plain = self.make_backend(hooks, platform, 6, 2, 64)
        limited = self.make_limited_backend(hooks, platform, (6, 2), 64, sliding_window=4, logit_softcap=3.0)
        q, k, v, k_cache, v_cache, meta = make_random_batch(13, 4, self.block_sizes[1], 6, 2, 64,
                                                            device=platform.device,
                                                            kinds=["chunk", "decode", "prefill", "decode"])
        expected = reference_attention(q, k, v, k_cache, v_cache, meta, limited.scale, 4, 3.0)
        out = limited.forward(q, k, v, k_cache, v_cache, plain.build_metadata(meta))
        torch.testing.assert_close(out, expected, **tolerance(torch.float32))

    # -- quantized KV (issue 31) ------------------------------------------------------------------------------
    def quantized_kv_dtypes(self, hooks: PluginHooks) -> list[torch.dtype]:
        """The int8 / fp8 KV dtypes the backend declares (skips the test when it declares none)."""
        found = [KV_CACHE_DTYPES[n] for n in hooks.attention_kv_dtypes(self.plugin_name)
                 if n in KV_CACHE_DTYPES and KV_CACHE_DTYPES[n] is not None and is_quantized(KV_CACHE_DTYPES[n])]
        if not found:
            pytest.skip(f"{self.plugin_name} declares no quantized KV dtype")
        return found

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    @pytest.mark.parametrize("window", [None, 5])
    def test_quantized_kv_matches_reference(self, hooks, platform, dtype: torch.dtype, window: int | None) -> None:
        """Over an int8 / fp8 pool the backend computes attention over the dequantized rows (within the dtype's
        tolerance), and stays within :func:`quantized_tolerance` of the float KV it stands for."""
        if dtype not in platform.supported_dtypes:
            pytest.skip(f"{dtype} is not computed on {platform.describe()}")
        for kv_dtype in self.quantized_kv_dtypes(hooks):
            backend = (self.make_backend(hooks, platform, 6, 2, 64, dtype) if window is None else
                       self.make_limited_backend(hooks, platform, (6, 2), 64, sliding_window=window, dtype=dtype))
            q, k, v, k_cache, v_cache, meta = make_random_batch(
                31, 6, self.block_sizes[1], 6, 2, 64, dtype, platform.device,
                ["prefill", "decode", "chunk", "decode", "chunk", "prefill"])
            float_ref = reference_attention(q, k, v, k_cache, v_cache, meta, backend.scale, window)
            k_q, v_q, kc_q, vc_q = quantized_kv(k, v, k_cache, v_cache, kv_dtype)
            out = backend.forward(q, k, v, kc_q, vc_q, backend.build_metadata(meta))
            expected = reference_attention(q, k_q, v_q, dequantize_rows(kc_q, torch.float32),
                                           dequantize_rows(vc_q, torch.float32), meta, backend.scale, window)
            torch.testing.assert_close(out, expected, **tolerance(dtype))
            torch.testing.assert_close(out.float(), float_ref.float(), **quantized_tolerance(kv_dtype, dtype))

    def test_quantized_write_kv_fills_exactly_the_mapped_slots(self, hooks, platform) -> None:
        for kv_dtype in self.quantized_kv_dtypes(hooks):
            backend = self.make_backend(hooks, platform, 4, 2, 64)
            _, k, v, k_cache, v_cache, meta = make_random_batch(5, 5, 4, 4, 2, 64, device=platform.device)
            k_cache, v_cache = quantize_rows(k_cache, kv_dtype), quantize_rows(v_cache, kv_dtype)
            before = [c.view(torch.uint8).clone() for c in (k_cache, v_cache)]
            backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            for new, cache, old in zip((k, v), (k_cache, v_cache), before, strict=True):
                rows = cache.view(-1, 2, 68)
                want = quantize_rows(new, kv_dtype).view(torch.uint8)
                assert torch.equal(rows[meta.slot_mapping].view(torch.uint8), want), f"{kv_dtype} rows differ"
                untouched = torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device)
                untouched[meta.slot_mapping] = False
                assert torch.equal(rows.view(torch.uint8)[untouched], old.view(-1, 2, 68)[untouched])

    def low_precision_dtypes(self, platform: Platform) -> list[torch.dtype]:
        """The 16-bit dtypes to check: float16 and bfloat16, those the platform computes in (a backend whose
        kernels cannot run one of them somewhere narrows this)."""
        return [d for d in (torch.float16, torch.bfloat16) if d in platform.supported_dtypes]

    def test_low_precision_matches_reference(self, hooks, platform) -> None:
        dtypes = self.low_precision_dtypes(platform)
        if not dtypes:
            pytest.skip(f"no 16-bit dtype to check on {platform.describe()}")
        for dtype in dtypes:
            self.check(hooks, platform, 5, 5, self.block_sizes[-2], self.head_layouts[1], self.head_dims[0], dtype)
