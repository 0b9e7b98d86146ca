"""Register plugins in process, so tests never depend on what is installed.

- :func:`registered` adds a module to one registry for the duration of a block and always removes it;
- :func:`register_source_tree` makes a plugin folder (its ``pyproject.toml`` entry points, its package imported
  from the folder) appear installed to every registry of this process, so a plugin's own tests run before its
  wheel is built; ``frame new-plugin`` calls it from the skeleton's ``tests/conftest.py``.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.plugins.registry import PluginRegistry
from frame.plugins.sources import register_source_tree

if TYPE_CHECKING:
    from frame.plugins.hooks import PluginHooks

__all__ = ["plugin_hooks", "plugin_module", "register_source_tree", "registered"]


def plugin_module(name: str, **attributes: object) -> types.ModuleType:
    """A module object holding hook implementations, as an entry point would load it.

    ``FRAME_API_VERSION`` defaults to the core's; pass ``FRAME_API_VERSION=None`` to leave it out.
    """
    from frame.version import API_VERSION

    module = types.ModuleType(name)
    module.FRAME_API_VERSION = API_VERSION  # type: ignore[attr-defined]
    for key, value in attributes.items():
        if value is None and key == "FRAME_API_VERSION":
            del module.FRAME_API_VERSION  # type: ignore[attr-defined]
        else:
            setattr(module, key, value)
    return module


@contextmanager
def registered(registry: PluginRegistry, kind: str, name: str, module: types.ModuleType) -> Iterator[None]:
    """Register ``module`` as plugin ``<kind>:<name>`` for the duration of the block."""
    registry.register(kind, name, module)
    try:
        yield
    finally:
        registry.unregister(kind, name)


@contextmanager
def plugin_hooks(kind: str, name: str, module: types.ModuleType) -> Iterator[tuple[PluginHooks, BaseModel | None]]:
    """For a conformance suite's ``created through the plugin hooks`` test: the hook facade over a registry that
    holds ``module`` as ``<kind>:<name>`` (nothing installed is consulted), and the plugin's options with their
    defaults (None when it declares no options model), for the duration of the block."""
    from frame.plugins.hooks import PluginHooks  # imported late: it pulls in torch

    registry = PluginRegistry(allow=None, disable=frozenset())
    with registered(registry, kind, name, module):
        hooks = PluginHooks(registry)
        model = hooks.options_model(kind, name)
        yield hooks, model() if model else None
