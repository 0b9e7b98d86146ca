"""Which installed model family builds a checkpoint's architecture, and what a broken family has to do with it.

A family whose ``frame_model_architectures`` raised (or that failed to load) cannot say which architectures it
builds, so it may be the one a checkpoint needs. The lookup never lets that pass unseen:

- a native family that lists the architecture serves it, and a broken family is beside the point (no message);
- otherwise, when no family serves it, the error names each broken family, its wheel and version and what it
  raised, instead of advising to install a wheel that is installed;
- otherwise, when only a fallback family (``frame_model_fallback``, e.g. ``transformers``) lists it, the fallback
  serves, and one warning line names the broken family that may have served it. It serves rather than refuses
  because the broken family is one nobody selected (a stray wheel must not stop every fallback architecture);
  ``FRAME_DISABLE_PLUGINS=model:<name>`` silences the warning.
"""

from __future__ import annotations

import logging

from frame.errors import UnknownPluginError
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import BrokenPlugin

log = logging.getLogger("frame.plugins")
#: The fallback's everyday line comes from the engine's plugin selection, as it did before this module.
selection_log = logging.getLogger("frame.selection")
#: Fallback warnings already said in this process.
_warned: set[str] = set()


def _named(broken: list[BrokenPlugin]) -> str:
    return "; ".join(f"the model family '{b.info.name}' ({b.info.origin}): {b.reason}" for b in broken)


def _fix(broken: list[BrokenPlugin]) -> str:
    return broken[0].fix.rstrip(",") if len(broken) == 1 else "fix or reinstall them"


def fallback_warning(architecture: str, fallback: str, broken: list[BrokenPlugin]) -> str:
    """The one line said when ``fallback`` serves ``architecture`` while ``broken`` families might have."""
    which = "it is" if len(broken) == 1 else "they are"
    names = ",".join(f"model:{b.info.name}" for b in broken)
    return (f"The fallback family '{fallback}' serves {architecture}, but a family that may build it natively is "
            f"broken ({_named(broken)}); {_fix(broken)}, or set FRAME_DISABLE_PLUGINS={names} if {which} not meant "
            f"to serve it.")


def no_family_error(architecture: str, working: list[str], broken: list[BrokenPlugin]) -> UnknownPluginError:
    """No family builds ``architecture``: name the broken ones that might, or say which wheel to install."""
    families = ", ".join(working) or "none"
    if broken:
        return UnknownPluginError(
            f"No working model family builds {architecture}, and one that may is broken ({_named(broken)}); "
            f"{_fix(broken)} (working families: {families}).", param="model")
    return UnknownPluginError(f"No installed model family builds {architecture}; installed families: {families} "
                              f"(install a frame-model-* wheel that supports it).", param="model")


def family_for(hooks: PluginHooks, architecture: str) -> str:
    """The installed model family whose ``frame_model_architectures`` lists ``architecture``: a native family
    first, a fallback family (``frame_model_fallback``) only when no native one lists it (see the module)."""
    families = list(hooks.registry.load_all("model"))
    fallbacks = [name for name in families if hooks.model_is_fallback(name)]
    broken = hooks.registry.broken("model")
    for name in [*(f for f in families if f not in fallbacks), *fallbacks]:
        if architecture in hooks.model_architectures(name):
            if name in fallbacks and broken:
                warning = fallback_warning(architecture, name, broken)
                if warning not in _warned:  # the engine core and an in-process worker both ask: say it once
                    _warned.add(warning)
                    log.warning(warning)
            elif name in fallbacks:
                selection_log.info("model family '%s' builds %s as the fallback: no native family claims it",
                                   name, architecture)
            return name
    excluded = hooks.registry.excluded_note("model")
    if excluded is not None:  # the allow-list, not the machine, is what is missing
        raise UnknownPluginError(excluded, param="model")
    raise no_family_error(architecture, families, broken)
