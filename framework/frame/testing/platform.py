"""Conformance suite of platform plugins: every hook and every Platform method is called and judged sane.

Subclass :class:`PlatformSuite` with ``plugin_name = "<platform>"``. Where the platform's check fails on this
machine the hooks are still checked and everything that needs the device is skipped. Override
:meth:`PlatformSuite.device_memory_bytes` to also check the KV budget against the device's real memory.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from frame.config import resolve_plugin_options
from frame.errors import ConfigError
from frame.interfaces.platform import Platform
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry

_GIB = 1 << 30


class PlatformSuite:
    """The checks every platform plugin passes."""

    plugin_name: ClassVar[str]

    @pytest.fixture(scope="class")
    def hooks(self) -> PluginHooks:
        return PluginHooks(PluginRegistry())

    @pytest.fixture(scope="class")
    def platform(self, hooks: PluginHooks) -> Platform:
        reason = hooks.platform_check(self.plugin_name)
        if reason is not None:
            pytest.skip(f"platform {self.plugin_name} cannot run here: {reason}")
        options_model = hooks.options_model("platform", self.plugin_name)
        return hooks.create_platform(self.plugin_name, options_model() if options_model else None)

    def device_memory_bytes(self, platform: Platform) -> int | None:
        """The device's memory, to bound the KV budget by; None skips that bound."""
        return None

    # -- hooks that work without the device -----------------------------------------------------------
    def test_check_and_priority(self, hooks: PluginHooks) -> None:
        reason = hooks.platform_check(self.plugin_name)
        assert reason is None or (isinstance(reason, str) and reason.strip())
        assert isinstance(hooks.platform_priority(self.plugin_name), int)

    def test_options_model_has_valid_defaults(self, hooks: PluginHooks) -> None:
        options_model = hooks.options_model("platform", self.plugin_name)
        if options_model is None:  # then any --platform-opt is refused, naming the plugin
            with pytest.raises(ConfigError, match=self.plugin_name):
                resolve_plugin_options("platform", self.plugin_name, {"no_such_key": 1}, None)
            return
        options_model()  # every field must have a default, since users may give none

    # -- the created platform -------------------------------------------------------------------------
    def test_unavailable_reason_agrees_with_check(self, hooks: PluginHooks, platform: Platform) -> None:
        assert type(platform).unavailable_reason() is None

    def test_device_holds_tensors(self, platform: Platform) -> None:
        assert isinstance(platform.device, torch.device)
        x = torch.arange(4.0, device=platform.device)
        assert x.device.type == platform.device.type and float(x.sum()) == 6.0

    def test_dtypes(self, platform: Platform) -> None:
        dtypes = list(platform.supported_dtypes)
        assert dtypes and all(isinstance(d, torch.dtype) and d.is_floating_point for d in dtypes)
        assert platform.default_dtype in dtypes
        for dtype in dtypes:
            a = torch.ones(8, 8, dtype=dtype, device=platform.device)
            assert float((a @ a)[0, 0]) == 8.0

    def test_describe_is_one_line(self, platform: Platform) -> None:
        text = platform.describe()
        assert isinstance(text, str) and text.strip() and "\n" not in text

    def test_kv_budget(self, platform: Platform) -> None:
        small_model = 100 * (1 << 20)
        budget = platform.kv_cache_budget_bytes(0.9, small_model)
        assert isinstance(budget, int) and budget > 0
        assert platform.kv_cache_budget_bytes(0.5, small_model) <= budget
        assert platform.kv_cache_budget_bytes(0.9, 2 * small_model) <= budget
        memory = self.device_memory_bytes(platform)
        if memory is not None:
            for fraction in (0.3, 0.9):
                assert platform.kv_cache_budget_bytes(fraction, small_model) <= fraction * memory - small_model

    def test_preferred_attention_is_installed(self, hooks: PluginHooks, platform: Platform) -> None:
        installed = hooks.registry.names("attention")
        if not installed:
            pytest.skip("no attention backend is installed")
        assert platform.preferred_attention(installed) in installed
        offered = [*installed, "not-a-real-backend"]
        assert platform.preferred_attention(offered) in offered

    def test_block_sizes(self, platform: Platform) -> None:
        sizes = platform.supported_block_sizes()
        assert sizes is None or (list(sizes) and all(isinstance(s, int) and s > 0 for s in sizes))

    def test_set_up(self, platform: Platform) -> None:
        platform.set_up()
