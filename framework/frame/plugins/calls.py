"""Calling one registered plugin's hook through pluggy, and saying in one line what went wrong in it."""

from __future__ import annotations

from typing import Any

import pluggy

#: An exception's text is cut here in messages, so one plugin's error stays one readable line.
_MAX_CAUSE = 300


def call_one(pm: pluggy.PluginManager, plugin_name: str, hook: str, **kwargs: Any) -> list[Any]:
    """The answers of the plugin registered as ``plugin_name`` to ``hook`` (empty when it does not implement it).

    The call goes through pluggy (so tracing and argument selection apply) restricted to that one plugin, so
    several plugins of a kind can be loaded without answering each other's calls. Exceptions propagate.
    """
    others = [plugin for name, plugin in pm.list_name_plugin() if name != plugin_name]
    return pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)


def implementers(pm: pluggy.PluginManager, hook: str) -> list[str]:
    """Names of the registered plugins that implement ``hook``, first registered first."""
    return [impl.plugin_name for impl in getattr(pm.hook, hook).get_hookimpls()]


def describe(err: BaseException) -> str:
    """``"Type: message"`` on one line, cut to a readable length."""
    text = " ".join(str(err).split())
    if len(text) > _MAX_CAUSE:
        text = text[: _MAX_CAUSE - 3] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
