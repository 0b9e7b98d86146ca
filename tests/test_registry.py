"""The plugin contract: listing, loading, and the one-sentence errors for every way a plugin can fail."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from frame import hookimpl
from frame.cli.new_plugin import write_skeleton
from frame.config import resolve_plugin_options
from frame.errors import (
    ConfigError,
    FrameUsageError,
    IncompatiblePluginError,
    PluginImportError,
    PluginUnavailableError,
    UnknownPluginError,
)
from frame.interfaces.scheduler import SchedulingPolicy
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.registration import plugin_module, register_source_tree, registered
from pydantic import BaseModel, ConfigDict, Field


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
        "The scheduler plugin 'future' (registered in-process) was written for plugin API 99, but this frame "
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
    assert message.startswith("The scheduler plugin 'old' (registered in-process) was written for plugin API 1, "
                              "but this frame implements API 2 (scheduler plugins now return a SchedulingPolicy")
    assert "see 'Migrating from API 1' in docs/plugins.md" in message and message.count(". ") == 0
    assert message.endswith("install a release of it made for API 2.")


def frame_scheduler_craete(limits, options):  # misspelled on purpose, as are the names below
    return None


def frame_make_coffee():
    return None


def _create_with_optoins(limits, optoins):
    return _NewestFirst(limits)


def _create(limits, options):
    return _NewestFirst(limits)


def _create_undecorated(limits, options):  # hookimpl() marks the function itself, so a second one
    return _NewestFirst(limits)


@pytest.mark.parametrize(("hooks", "problem"), [
    ({"frame_scheduler_craete": hookimpl(frame_scheduler_craete)},
     "implements frame_scheduler_craete, which is not a frame hook; did you mean frame_scheduler_create?"),
    ({"frame_scheduler_create": hookimpl(_create), "frame_make_coffee": hookimpl(frame_make_coffee)},
     "implements frame_make_coffee, which is not a frame hook; every hook is listed in docs/plugins.md."),
    ({"frame_scheduler_create": hookimpl(_create_with_optoins)},
     "implements frame_scheduler_create with an argument 'optoins' that this hook does not pass (it passes limits, "
     "options); rename or remove that argument."),
    ({"frame_scheduler_create": _create_undecorated},
     "defines frame_scheduler_create without the @hookimpl decorator; decorate it (from frame import hookimpl)."),
], ids=["misspelled", "unknown", "argument", "undecorated"])
def test_hook_mistakes_are_one_sentence_naming_hook_and_argument(hooks: dict, problem: str) -> None:
    with pytest.raises(IncompatiblePluginError) as err:
        PluginRegistry().register("scheduler", "mine", plugin_module("mine", **hooks))
    assert str(err.value) == f"The scheduler plugin 'mine' (registered in-process) {problem}"


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


class _Lenient(BaseModel):
    """An options model that would let anything through on its own."""

    model_config = ConfigDict(extra="allow")

    max_waiting: int = 8
    budget: int = Field(4, alias="token_budget")


def test_unknown_option_keys_are_refused_even_when_the_model_allows_extras() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_plugin_options("scheduler", "sjf", {"max_wait": 3}, _Lenient)
    assert str(err.value) == (
        "Unknown scheduler 'sjf' option key 'max_wait'; did you mean 'max_waiting'? valid keys: max_waiting, budget."
    )
    assert resolve_plugin_options("scheduler", "sjf", {"token_budget": 2}, _Lenient).budget == 2


def test_the_message_is_the_one_lpm_gives() -> None:
    from frame_scheduler_lpm.scheduler import LpmOptions

    with pytest.raises(ConfigError) as err:
        resolve_plugin_options("scheduler", "lpm", {"max_waiting_for_lmp": 3}, LpmOptions)
    assert str(err.value) == (
        "Unknown scheduler 'lpm' option key 'max_waiting_for_lmp'; did you mean 'max_waiting_for_lpm'? valid keys: "
        "max_waiting_for_lpm, in_batch_prefix_tokens."
    )


@pytest.fixture
def source_tree(tmp_path: Path) -> Iterator[Path]:
    """A scheduler skeleton from `frame new-plugin`, registered from its folder for the test."""
    folder = write_skeleton("scheduler", "from_src", tmp_path)
    undo = register_source_tree(folder)
    yield folder
    undo()
    for name in [m for m in sys.modules if m.startswith("frame_scheduler_from_src")]:
        del sys.modules[name]
    assert str(folder) not in sys.path and "from_src" not in PluginRegistry().names("scheduler")


def test_a_source_tree_is_listed_and_loaded_as_if_installed(source_tree: Path) -> None:
    registry = PluginRegistry()
    info = registry.info("scheduler", "from_src")
    assert (info.distribution, info.version, info.source) == ("frame-scheduler-from-src", "0.1.0", source_tree)
    module = registry.load("scheduler", "from_src")
    assert Path(module.__file__) == source_tree / "frame_scheduler_from_src" / "plugin.py"


def test_a_source_tree_that_fails_to_import_is_one_sentence(source_tree: Path) -> None:
    plugin = source_tree / "frame_scheduler_from_src" / "plugin.py"
    plugin.write_text(plugin.read_text() + "\nimport not_a_real_dependency\n")
    with pytest.raises(PluginImportError) as err:
        PluginRegistry(allow=frozenset({"from_src", "fcfs"})).load("scheduler", "from_src")
    assert str(err.value) == (
        f"The scheduler plugin 'from_src' from the source tree of frame-scheduler-from-src 0.1.0 at {source_tree} "
        "failed to import (ModuleNotFoundError: No module named 'not_a_real_dependency'); fix it or choose another "
        "of: fcfs (--sched)."
    )


def test_a_folder_without_frame_entry_points_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(FrameUsageError, match=r"has no pyproject\.toml; pass the plugin's folder"):
        register_source_tree(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "frame-nothing"\n')
    with pytest.raises(FrameUsageError) as err:
        register_source_tree(tmp_path)
    assert str(err.value) == (
        f'{tmp_path / "pyproject.toml"} declares no frame plugin; add an entry point under '
        '[project.entry-points."frame.<kind>"] (see docs/plugins.md).'
    )
