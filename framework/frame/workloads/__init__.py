"""Benchmark workloads and their catalog.

The catalog asks every plugin through the ``frame_workloads`` hook. The built-ins answer it from the in-process
plugin module :mod:`frame.workloads.builtin`; plugins in the entry-point group ``frame.workloads`` are registered
the same way. A workload plugin that fails to load is reported in ``WorkloadCatalog.failures``, never fatal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType

import pluggy
import stevedore

from frame.errors import ConfigError
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.version import SUPPORTED_API_VERSIONS
from frame.workloads import builtin
from frame.workloads.base import Workload, WorkloadContext, WorkloadRequest, greedy

log = logging.getLogger("frame.workloads")

#: Entry-point group of wheels that only add workloads.
WORKLOAD_GROUP = "frame.workloads"


def _register(registry: PluginRegistry, name: str, module: ModuleType) -> None:
    plugin_name = f"workload:{name}"
    if registry.pm.has_plugin(plugin_name):
        return
    if getattr(module, "FRAME_API_VERSION", None) not in SUPPORTED_API_VERSIONS:
        raise ValueError(f"declares FRAME_API_VERSION {getattr(module, 'FRAME_API_VERSION', None)!r}")
    registry.pm.register(module, name=plugin_name)
    try:
        registry.pm.check_pending()
    except pluggy.PluginValidationError:
        registry.pm.unregister(module)
        raise


@dataclass
class WorkloadCatalog:
    """The workloads every registered plugin offers, by name."""

    workloads: dict[str, Workload]
    failures: dict[str, str] = field(default_factory=dict)

    def get(self, name: str) -> Workload:
        try:
            return self.workloads[name]
        except KeyError:
            raise ConfigError(f"No workload named '{name}'; choose one of: {', '.join(sorted(self.workloads))}.",
                              param="workload") from None


def load_workloads(registry: PluginRegistry | None = None) -> WorkloadCatalog:
    """Register the built-ins and the ``frame.workloads`` entry points, then collect every hook answer."""
    registry = registry or PluginRegistry()
    failures: dict[str, str] = {}
    _register(registry, "builtin", builtin)
    errors: list[tuple[str, BaseException]] = []
    manager = stevedore.ExtensionManager(
        WORKLOAD_GROUP, on_load_failure_callback=lambda _m, ep, err: errors.append((ep.name, err))
    )
    for ext in manager:
        try:
            _register(registry, ext.name, ext.plugin)
        except (ValueError, pluggy.PluginValidationError) as err:
            errors.append((ext.name, err))
    for name, err in errors:
        failures[name] = f"workload plugin '{name}' was skipped ({type(err).__name__}: {err})"
        log.warning(failures[name])
    found: dict[str, Workload] = {}
    for workload in PluginHooks(registry).workloads():
        if workload.name in found:
            raise ConfigError(f"Two plugins offer a workload named '{workload.name}'; uninstall one of them.",
                              param="workload")
        found[workload.name] = workload
    return WorkloadCatalog(found, failures)


__all__ = ["Workload", "WorkloadCatalog", "WorkloadContext", "WorkloadRequest", "greedy", "load_workloads"]
