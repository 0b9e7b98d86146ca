"""Hook specifications: the functions a plugin implements, one module per plugin kind.

A plugin is a module (named by its entry point) holding ``@hookimpl`` functions and the constant
``FRAME_API_VERSION``. The registry registers it with pluggy under ``<kind>:<name>``, which validates every
hook's signature at load time; the core then calls hooks only through :class:`frame.plugins.hooks.PluginHooks`.

Hook names are ``frame_<kind>_<verb>``. Every spec says who calls it, when, what each parameter is, what the
return means, and since which API version it exists.
"""

import pluggy

PROJECT = "frame"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = ["PROJECT", "hookimpl", "hookspec"]
