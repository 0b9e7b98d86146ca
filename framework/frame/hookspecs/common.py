"""Hooks every plugin may implement, whatever its kind."""

from __future__ import annotations

from pydantic import BaseModel

from frame.hookspecs import hookspec


@hookspec
def frame_plugin_options() -> type[BaseModel] | None:
    """The pydantic model of this plugin's own options, or None when it takes none.

    Called by the core on the selected plugin (only) while building the engine config, before anything is
    created. Its fields become the config section named after the plugin (``caches: {radix: {...}}`` in YAML)
    and ``--<kind>-opt key=value`` flags; an unknown key is a config error naming the valid ones. The validated
    instance is passed to the plugin's ``create`` hook as ``options``. Since API 1.
    """
