"""A plugin that raises in a hook is isolated: a row of its own when nobody chose it, one sentence when chosen."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from frame import hookimpl
from frame.cli.plugins_cmd import collect
from frame.engine.selection import select_attention, select_model_family, select_platform
from frame.errors import PluginUnavailableError
from frame.interfaces.scheduler import SchedulingPolicy
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.registration import plugin_module, registered


def _raise(message: str):
    def hook(*_args, **_kwargs):
        raise RuntimeError(message)

    return hook


def _platform(check=None) -> object:
    @hookimpl
    def frame_platform_create(options):
        raise AssertionError("a broken platform must never be created")

    return plugin_module("bad_platform", frame_platform_check=hookimpl(check or _raise("probe exploded")),
                         frame_platform_create=frame_platform_create)


def _attention(**hooks) -> object:
    @hookimpl
    def frame_attention_create(num_heads, num_kv_heads, head_dim, scale, dtype, platform, options):
        raise AssertionError("a broken backend must never be created")

    return plugin_module("bad_attention", frame_attention_create=frame_attention_create,
                         **{name: hookimpl(fn) for name, fn in hooks.items()})


def _model() -> object:
    @hookimpl
    def frame_model_create(hf_config, dtype, device, attention):
        raise AssertionError("a broken family must never build")

    return plugin_module("bad_model", frame_model_architectures=hookimpl(_raise("cannot list")),
                         frame_model_create=frame_model_create)


@pytest.fixture
def broken() -> Iterator[PluginHooks]:
    """A registry holding the installed plugins plus a platform, two backends and a family whose probes raise."""
    registry = PluginRegistry()
    with ExitStack() as stack:
        stack.enter_context(registered(registry, "platform", "bad", _platform()))
        stack.enter_context(registered(registry, "attention", "bad_list", _attention(
            frame_attention_platforms=_raise("platform list exploded"))))
        stack.enter_context(registered(registry, "attention", "bad_check", _attention(
            frame_attention_platforms=lambda: ["cpu"], frame_attention_check=_raise("check exploded"))))
        stack.enter_context(registered(registry, "model", "bad", _model()))
        yield PluginHooks(registry)


def test_frame_plugins_reports_each_one_in_its_own_row(broken: PluginHooks) -> None:
    rows = {(r.kind, r.name): r for r in collect(broken.registry)}
    assert rows[("platform", "bad")].why == (
        "The platform plugin 'bad' (registered in-process) cannot run here: its frame_platform_check raised "
        "RuntimeError: probe exploded; fix it or choose another of: cpu (--platform)."
    )
    assert rows[("attention", "bad_list")].why.startswith(
        "The attention plugin 'bad_list' (registered in-process) cannot run here: its frame_attention_platforms "
        "raised RuntimeError: platform list exploded; fix it or choose another of: "
    )
    assert rows[("attention", "bad_check")].why == (
        "cannot run here: its frame_attention_check raised RuntimeError: check exploded (registered in-process)"
    )
    families = ", ".join(sorted(name for kind, name in rows if kind == "model" and name != "bad"))
    assert rows[("model", "bad")].why == (
        "The model plugin 'bad' (registered in-process) cannot run here: its frame_model_architectures raised "
        f"RuntimeError: cannot list; fix it or choose another of: {families} (chosen by the checkpoint's "
        "architectures)."
    )
    for key in (("platform", "bad"), ("attention", "bad_list"), ("attention", "bad_check"), ("model", "bad")):
        assert not rows[key].runs_here and "\n" not in rows[key].why
    assert rows[("platform", "cpu")].runs_here and rows[("attention", "sdpa")].runs_here
    assert rows[("model", "llama")].runs_here


def test_auto_choices_pass_over_them(broken: PluginHooks) -> None:
    assert select_platform(broken, "auto") == "cpu"
    platform = broken.create_platform("cpu", None)
    platform.name = "cpu"
    assert select_attention(broken, "auto", platform) in ("cpu_paged", "sdpa")
    assert select_model_family(broken, "LlamaForCausalLM") == "llama"


def test_chosen_by_name_each_is_one_sentence_naming_the_hook(broken: PluginHooks) -> None:
    with pytest.raises(PluginUnavailableError) as err:
        select_platform(broken, "bad")
    assert "its frame_platform_check raised RuntimeError: probe exploded" in str(err.value)
    platform = broken.create_platform("cpu", None)
    platform.name = "cpu"
    with pytest.raises(PluginUnavailableError, match="its frame_attention_platforms raised RuntimeError"):
        select_attention(broken, "bad_list", platform)
    with pytest.raises(PluginUnavailableError) as err:
        select_attention(broken, "bad_check", platform)
    assert str(err.value).startswith(
        "The attention backend 'bad_check' cannot run here: its frame_attention_check raised RuntimeError: check "
        "exploded (registered in-process); installed backends that would serve here: "
    )


def test_the_hint_lists_only_plugins_that_load_and_can_run() -> None:
    registry = PluginRegistry()
    with registered(registry, "platform", "bad", _platform()), \
            registered(registry, "platform", "worse", _platform(_raise("worse"))):
        with pytest.raises(PluginUnavailableError) as err:
            registry.load("platform", "bad")
        # Not 'worse' (broken too), nor cuda or rocm (sound, but their device is not here).
        assert str(err.value).endswith("; fix it or choose another of: cpu (--platform).")
        assert set(registry.failures) == {("platform", "bad"), ("platform", "worse")}
    assert not registry.failures


def test_a_probe_that_raises_after_load_breaks_the_plugin_from_then_on() -> None:
    calls: list[int] = []

    def check():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("flaky")

    registry = PluginRegistry()
    hooks = PluginHooks(registry)
    with registered(registry, "platform", "flaky", _platform(check)):
        registry.load("platform", "flaky")  # its check passes once, at load
        with pytest.raises(PluginUnavailableError, match="its frame_platform_check raised RuntimeError: flaky"):
            hooks.platform_check("flaky")
        assert select_platform(hooks, "auto") == "cpu"
        assert ("platform", "flaky") in registry.failures


def test_a_broadcast_hook_that_raises_is_logged_once_and_the_others_still_hear(caplog) -> None:
    heard: list[str] = []

    @hookimpl
    def frame_request_finished(seq_id):
        heard.append(seq_id)

    class Fifo(SchedulingPolicy):
        def admission_order(self, waiting, prefix):
            return waiting

        def preemption_victim(self, running):
            return running[-1]

    @hookimpl
    def frame_scheduler_create(limits, options):
        return Fifo(limits)

    registry = PluginRegistry()
    loud = plugin_module("loud", frame_scheduler_create=frame_scheduler_create,
                         frame_request_finished=hookimpl(_raise("exporter down")))
    quiet = plugin_module("quiet", frame_scheduler_create=frame_scheduler_create,
                          frame_request_finished=frame_request_finished)
    hooks = PluginHooks(registry)
    with registered(registry, "scheduler", "loud", loud), registered(registry, "scheduler", "quiet", quiet), \
            caplog.at_level(logging.WARNING, logger="frame.plugins"):
        for seq_id in ("a", "b"):
            hooks.request_finished(seq_id, 3, 2, 0, "stop")
    assert heard == ["a", "b"]
    assert [r.getMessage() for r in caplog.records] == [
        "The plugin 'scheduler:loud' raised in frame_request_finished (RuntimeError: exporter down); frame carries "
        "on without its answer."
    ]
