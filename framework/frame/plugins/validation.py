"""A plugin module's hook implementations checked against frame's hookspecs, before pluggy sees them.

Pluggy validates too, but reports in several lines of its own text. These checks find the same mistakes (a hook
name that is not a frame hook, an argument the hook does not pass, a required hook left undecorated) and say each
in one phrase that names the hook and the argument, with a suggestion for a misspelled name.
"""

from __future__ import annotations

import difflib
from types import ModuleType

import pluggy


def spec_names(pm: pluggy.PluginManager) -> list[str]:
    """Every hook frame specifies."""
    return sorted(name for name, caller in vars(pm.hook).items() if getattr(caller, "spec", None) is not None)


def _unknown_hook(pm: pluggy.PluginManager, hook: str) -> str:
    close = difflib.get_close_matches(hook, spec_names(pm), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else "; every hook is listed in docs/plugins.md"
    return f"implements {hook}, which is not a frame hook{hint}"


def hookimpl_problem(pm: pluggy.PluginManager, module: ModuleType, plugin_name: str) -> str | None:
    """What is wrong with ``module``'s hook implementations, as a phrase after "The plugin 'x' ", or None."""
    for attr in sorted(dir(module)):
        opts = pm.parse_hookimpl_opts(module, attr)
        if opts is None:
            continue
        caller = getattr(pm.hook, attr, None)
        spec = getattr(caller, "spec", None)
        if spec is None:
            return _unknown_hook(pm, attr)
        impl = pluggy.HookImpl(module, plugin_name, getattr(module, attr), opts)
        extra = [arg for arg in impl.argnames if arg not in spec.argnames]
        if extra:
            passed = ", ".join(spec.argnames) or "no arguments"
            return (f"implements {attr} with an argument '{extra[0]}' that this hook does not pass (it passes "
                    f"{passed}); rename or remove that argument")
    return None


def missing_hook_problem(module: ModuleType, required_hook: str, kind: str) -> str:
    """Why ``module`` does not count as implementing ``required_hook``, as a phrase like :func:`hookimpl_problem`."""
    if callable(getattr(module, required_hook, None)):
        return f"defines {required_hook} without the @hookimpl decorator; decorate it (from frame import hookimpl)"
    return f"does not implement {required_hook}, which every {kind} plugin must"
