"""Hooks every plugin may implement, whatever its kind."""

from __future__ import annotations

from pydantic import BaseModel

from frame.hookspecs import hookspec


@hookspec
def frame_plugin_options() -> type[BaseModel] | None:
    """The pydantic model of this plugin's own options, or None when it takes none.

    Called by the core on the selected plugin (only) while building the engine config, before anything is
    created. Its fields are the keys of the kind's options section of the engine config (``platform_options``,
    ``attn_options``, ``cache_options`` or ``sched_options`` in YAML, ``--platform-opt``, ``--attn-opt``,
    ``--cache-opt`` or ``--sched-opt key=value`` on the command line); a key the model does not declare is a
    config error naming the valid ones, whatever the model's own ``extra`` setting. The validated instance is
    passed to the plugin's ``create`` hook as ``options``. Since API 1.
    """
