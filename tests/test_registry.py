"""The plugin contract: listing, loading, and the one-sentence errors for every way a plugin can fail."""

from __future__ import annotations

import pytest
from frame import hookimpl
from frame.errors import IncompatiblePluginError, PluginUnavailableError, UnknownPluginError
from frame.interfaces.scheduler import SchedulingPolicy
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.registration import plugin_module, registered


class _NewestFirst(SchedulingPolicy):
    def admission_order(self, waiting, prefix):
        return list(reversed(waiting))

    def preemption_victim(self, running):
        return running[-1]


def _scheduler_plugin(**extra: object):
    @hookimpl
    def frame_scheduler_create(limits, options):
        return _NewestFirst(limits)

    return plugin_module("my_sched", frame_scheduler_create=frame_scheduler_create, **extra)


def test_installed_lists_in_tree_plugins_without_importing_them() -> None:
    registry = PluginRegistry()
    names = {p.name for p in registry.installed("cache")}
    assert {"hashchain", "none", "radix"} <= names
    assert not registry.is_loaded("cache", "hashchain")
    info = next(p for p in registry.installed("cache") if p.name == "hashchain")
    assert info.distribution == "frame-cache-hashchain" and info.target == "frame_cache_hashchain.plugin"


def test_unknown_name_lists_the_installed_ones() -> None:
    with pytest.raises(UnknownPluginError) as err:
        PluginRegistry().load("cache", "hashchian")
    assert str(err.value) == (
        "No cache plugin named 'hashchian' is installed; choose one of: hashchain, none, radix (--cache)."
    )


def test_incompatible_api_version_is_refused_with_a_message() -> None:
    registry = PluginRegistry()
    with pytest.raises(IncompatiblePluginError) as err:
        registry.register("scheduler", "future", _scheduler_plugin(FRAME_API_VERSION=99))
    assert str(err.value) == (
        "The scheduler plugin 'future' ((registered in-process)) was written for plugin API 99, but this frame "
        "implements API 2; install a release of it made for API 2."
    )
    with pytest.raises(IncompatiblePluginError, match="declares no FRAME_API_VERSION"):
        registry.register("scheduler", "old", _scheduler_plugin(FRAME_API_VERSION=None))


def test_an_api_1_plugin_is_refused_in_one_sentence_naming_what_changed() -> None:
    @hookimpl
    def frame_scheduler_create(limits, cache, options):  # the API-1 signature
        return None

    module = plugin_module("old_sched", FRAME_API_VERSION=1, frame_scheduler_create=frame_scheduler_create)
    with pytest.raises(IncompatiblePluginError) as err:
        PluginRegistry().register("scheduler", "old", module)
    message = str(err.value)
    assert message.startswith("The scheduler plugin 'old' ((registered in-process)) was written for plugin API 1, "
                              "but this frame implements API 2 (scheduler plugins now return a SchedulingPolicy")
    assert "see 'Migrating from API 1' in docs/plugins.md" in message and message.count(". ") == 0
    assert message.endswith("install a release of it made for API 2.")


def test_misspelled_hook_fails_at_load() -> None:
    @hookimpl
    def frame_scheduler_craete(limits, options):  # the typo is the point
        return None

    module = plugin_module("typo", frame_scheduler_craete=frame_scheduler_craete)
    with pytest.raises(IncompatiblePluginError, match="does not match frame's hookspecs"):
        PluginRegistry().register("scheduler", "typo", module)


def test_plugin_without_its_required_hook_is_refused() -> None:
    with pytest.raises(IncompatiblePluginError) as err:
        PluginRegistry().register("cache", "empty", plugin_module("empty"))
    assert "does not implement frame_cache_create, which every cache plugin must" in str(err.value)


def test_registered_plugin_is_listed_and_removed_afterwards() -> None:
    registry = PluginRegistry()
    with registered(registry, "scheduler", "mine", _scheduler_plugin()):
        assert "mine" in registry.names("scheduler")
    assert "mine" not in registry.names("scheduler")


def test_allow_list_limits_what_loads() -> None:
    registry = PluginRegistry(allow=frozenset({"hashchain", "scheduler:fcfs"}))
    assert registry.names("cache") == ["hashchain"]
    assert registry.names("scheduler") == ["fcfs"]
    with pytest.raises(UnknownPluginError) as err:
        registry.load("cache", "radix")
    assert str(err.value) == (
        "The cache plugin 'radix' is installed but it is not listed in FRAME_PLUGINS; add it there or unset the "
        "variable."
    )


def test_allow_list_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAME_PLUGINS", "none")
    monkeypatch.setenv("FRAME_DISABLE_PLUGINS", "")
    assert PluginRegistry().names("cache") == ["none"]


def test_disable_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAME_DISABLE_PLUGINS", "radix")
    assert "radix" not in PluginRegistry().names("cache")


def test_hook_tracing_writes_every_call(capfd: pytest.CaptureFixture[str]) -> None:
    hooks = PluginHooks(PluginRegistry(trace=True))
    hooks.platform_check("cpu")
    assert "frame_platform_check" in capfd.readouterr().err


def test_backend_that_cannot_run_here_names_platforms_and_alternatives() -> None:
    from frame.engine.selection import select_attention

    registry = PluginRegistry()
    hooks = PluginHooks(registry)

    @hookimpl
    def frame_attention_platforms():
        return ["rocm"]

    @hookimpl
    def frame_attention_create(num_heads, num_kv_heads, head_dim, scale, dtype, platform, options):
        raise AssertionError("must not be created")

    module = plugin_module("rocm_only", frame_attention_platforms=frame_attention_platforms,
                           frame_attention_create=frame_attention_create)
    platform = hooks.create_platform("cpu", None)
    platform.name = "cpu"
    with registered(registry, "attention", "rocm_only", module), pytest.raises(PluginUnavailableError) as err:
        select_attention(hooks, "rocm_only", platform)
    message = str(err.value)
    assert message.startswith(f"The attention backend 'rocm_only' runs on rocm only, but this machine is "
                              f"{platform.describe()}; installed backends that would serve here: ")
    assert "sdpa" in message and message.endswith(".")


def test_auto_attention_passes_over_a_backend_that_cannot_serve_here(monkeypatch) -> None:
    from frame.engine.selection import select_attention
    from frame_attention_cpu_paged import kernel

    monkeypatch.setattr(kernel, "unavailable_reason", lambda: "needs a C++ compiler to build its kernel")
    hooks = PluginHooks(PluginRegistry())
    platform = hooks.create_platform("cpu", None)
    platform.name = "cpu"
    assert select_attention(hooks, "auto", platform) == "sdpa"
    with pytest.raises(PluginUnavailableError, match="'cpu_paged' needs a C\\+\\+ compiler to build its kernel; "
                                                     "installed backends that would serve here: sdpa"):
        select_attention(hooks, "cpu_paged", platform)
