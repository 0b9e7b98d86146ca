"""Benchmark workloads and their catalog.

Workloads are a plugin kind (``workload``, entry-point group ``frame.workloads``, hook ``frame_workload_list``).
The built-ins answer the hook from the in-process plugin module :mod:`frame.workloads.builtin`, registered as
``workload:builtin``; every other workload plugin loads through the :class:`~frame.plugins.registry.PluginRegistry`
like a plugin of any kind. A workload plugin that fails to load, or whose hook raises or answers something other
than a list of workloads, is reported in :attr:`WorkloadCatalog.failures` and logged, never fatal; two workloads of
one name, or an unknown name, are usage errors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from frame.errors import ConfigError
from frame.interfaces.workload import Workload, WorkloadContext, WorkloadRequest, greedy
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.workloads import builtin

log = logging.getLogger("frame.workloads")


@dataclass
class WorkloadCatalog:
    """The workloads every registered plugin offers, by name; ``failures``: plugin name -> why it was skipped."""

    workloads: dict[str, Workload]
    failures: dict[str, str] = field(default_factory=dict)
    #: workload name -> the plugin that offers it (``workload:builtin`` for the core's own).
    providers: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Workload:
        try:
            return self.workloads[name]
        except KeyError:
            raise ConfigError(f"No workload named '{name}'; choose one of: {', '.join(sorted(self.workloads))}.",
                              param="workload") from None


def register_builtin(registry: PluginRegistry) -> None:
    """Register the core's own workloads as the in-process plugin ``workload:builtin`` (once per registry)."""
    if not registry.is_loaded("workload", "builtin"):
        registry.register("workload", "builtin", builtin)


def load_workloads(registry: PluginRegistry | None = None) -> WorkloadCatalog:
    """Register the built-ins, load every enabled workload plugin, then collect every plugin's workloads."""
    registry = registry or PluginRegistry()
    register_builtin(registry)
    registry.load_all("workload")
    failures = {name: message for (kind, name), message in registry.failures.items() if kind == "workload"}
    found: dict[str, Workload] = {}
    providers: dict[str, str] = {}
    for plugin, answer in PluginHooks(registry).workloads():
        if not isinstance(answer, (list, tuple)) or not all(isinstance(w, Workload) for w in answer):
            failures[plugin] = (f"The plugin '{plugin}' answered its workload hook with {type(answer).__name__}, "
                                "not a list of frame.interfaces.workload.Workload; its workloads are left out.")
            continue
        for workload in answer:
            if workload.name in found:
                both = " and ".join(sorted((providers[workload.name], plugin)))
                raise ConfigError(f"Two plugins offer a workload named '{workload.name}' ({both}); uninstall one of "
                                  "them.", param="workload")
            found[workload.name] = workload
            providers[workload.name] = plugin
    for message in failures.values():
        log.warning(message)
    return WorkloadCatalog(found, failures, providers)


__all__ = ["Workload", "WorkloadCatalog", "WorkloadContext", "WorkloadRequest", "greedy", "load_workloads",
           "register_builtin"]
