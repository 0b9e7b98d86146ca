"""Plugin discovery (stevedore), dispatch (pluggy) and the typed facade the core calls hooks through."""

from frame.plugins.kinds import KINDS, PluginKind
from frame.plugins.registry import PluginInfo, PluginRegistry

__all__ = ["KINDS", "PluginInfo", "PluginKind", "PluginRegistry"]
