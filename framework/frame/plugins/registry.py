"""PluginRegistry: finds plugins through entry points (stevedore) and registers them with pluggy.

Listing reads entry-point metadata only; nothing is imported until a plugin is loaded by name. Loading checks the
declared ``FRAME_API_VERSION`` and registers the module with pluggy as ``<kind>:<name>``, which validates its hook
signatures. Failures become one-sentence :class:`~frame.errors.PluginError` messages; ``load_all`` records them
instead, so one broken plugin never stops the others.

Escape hatches, read from the environment when the registry is built:

- ``FRAME_PLUGINS=a,b,cache:c``: only the named plugins load (a bare name matches any kind);
- ``FRAME_DISABLE_PLUGINS=a,b``: these never load;
- ``FRAME_TRACE_HOOKS=1``: every hook call is written to stderr.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from types import ModuleType

import pluggy
import stevedore

from frame.errors import IncompatiblePluginError, PluginImportError, UnknownPluginError
from frame.hookspecs import PROJECT
from frame.plugins.kinds import KINDS, SHARED_SPECS, PluginKind
from frame.version import API_CHANGES, API_VERSION, SUPPORTED_API_VERSIONS


@dataclass(frozen=True)
class PluginInfo:
    """An installed plugin as its entry point describes it (nothing imported)."""

    kind: str
    name: str
    target: str
    distribution: str | None = None
    version: str | None = None

    @property
    def wheel(self) -> str:
        if self.distribution is None:
            return "(registered in-process)"
        return f"{self.distribution} {self.version}"


def _names_from_env(variable: str) -> frozenset[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def _info(kind: PluginKind, ep: EntryPoint, owners: dict[str, tuple[str, str]]) -> PluginInfo:
    dist, version = owners.get(ep.name, (None, None))
    return PluginInfo(kind.name, ep.name, ep.value, dist, version)


def _owners(group: str) -> dict[str, tuple[str, str]]:
    """Entry-point name -> (distribution, version); stevedore's cached entry points do not carry them."""
    owners = {}
    for ep in importlib.metadata.entry_points(group=group):
        if ep.dist is not None:
            owners[ep.name] = (ep.dist.name, ep.dist.version)
    return owners


class PluginRegistry:
    """Installed plugins of every kind, and the pluggy manager holding the loaded ones."""

    def __init__(
        self,
        allow: frozenset[str] | None = None,
        disable: frozenset[str] | None = None,
        trace: bool | None = None,
    ) -> None:
        self.allow = allow if allow is not None else _names_from_env("FRAME_PLUGINS")
        self.disable = disable if disable is not None else (_names_from_env("FRAME_DISABLE_PLUGINS") or frozenset())
        self.pm = pluggy.PluginManager(PROJECT)
        for kind in KINDS.values():
            self.pm.add_hookspecs(kind.specs)
        for specs in SHARED_SPECS:
            self.pm.add_hookspecs(specs)
        if trace if trace is not None else os.environ.get("FRAME_TRACE_HOOKS") == "1":
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self._loaded: dict[tuple[str, str], ModuleType] = {}
        self._extra: dict[tuple[str, str], PluginInfo] = {}
        #: ``(kind, name) -> message`` for plugins that failed in :meth:`load_all`.
        self.failures: dict[tuple[str, str], str] = {}

    # -- listing (no imports) -------------------------------------------------------------------------
    @staticmethod
    def refresh() -> None:
        """Forget cached entry points, e.g. after a wheel was installed while this process runs."""
        stevedore.ExtensionManager.ENTRY_POINT_CACHE.clear()

    def installed(self, kind: str) -> list[PluginInfo]:
        """Every plugin of ``kind`` that is installed or registered in-process, sorted by name."""
        spec = KINDS[kind]
        manager = stevedore.NamedExtensionManager(spec.group, names=[])
        owners = _owners(spec.group)
        found = {ep.name: _info(spec, ep, owners) for ep in manager.list_entry_points()}
        found.update({name: info for (k, name), info in self._extra.items() if k == kind})
        return [found[name] for name in sorted(found)]

    def disabled_reason(self, kind: str, name: str) -> str | None:
        """Why the escape hatches keep this plugin from loading, or None."""
        if name in self.disable or f"{kind}:{name}" in self.disable:
            return "it is listed in FRAME_DISABLE_PLUGINS"
        if self.allow is not None and name not in self.allow and f"{kind}:{name}" not in self.allow:
            return "it is not listed in FRAME_PLUGINS"
        return None

    def names(self, kind: str) -> list[str]:
        """Names of the plugins of ``kind`` that may load here (installed and not disabled)."""
        return [p.name for p in self.installed(kind) if self.disabled_reason(kind, p.name) is None]

    # -- loading ----------------------------------------------------------------------------------------
    def is_loaded(self, kind: str, name: str) -> bool:
        return (kind, name) in self._loaded

    def load(self, kind: str, name: str) -> ModuleType:
        """Import and register one plugin; raises a PluginError with a one-sentence message on failure."""
        if (kind, name) in self._loaded:
            return self._loaded[(kind, name)]
        spec = KINDS[kind]
        infos = {p.name: p for p in self.installed(kind)}
        available = [n for n in infos if self.disabled_reason(kind, n) is None]
        if name not in infos:
            choices = ", ".join(available) or "(none installed)"
            raise UnknownPluginError(
                f"No {kind} plugin named '{name}' is installed; choose one of: {choices} (--{spec.flag}).",
                param=spec.flag,
            )
        reason = self.disabled_reason(kind, name)
        if reason is not None:
            raise UnknownPluginError(
                f"The {kind} plugin '{name}' is installed but {reason}; add it there or unset the variable.",
                param=spec.flag,
            )
        info = infos[name]
        errors: list[BaseException] = []
        manager = stevedore.NamedExtensionManager(
            spec.group, names=[name], on_load_failure_callback=lambda _m, _ep, err: errors.append(err),
            on_missing_entrypoints_callback=lambda _names: None,  # reported below, as one sentence
        )
        if errors or name not in manager.names():
            cause = f"{type(errors[0]).__name__}: {errors[0]}" if errors else "its entry point did not load"
            others = [n for n in available if n != name]
            raise PluginImportError(
                f"The {kind} plugin '{name}' from wheel {info.wheel} failed to import ({cause}); reinstall that "
                f"wheel or choose another of: {', '.join(others) or '(none installed)'}.",
                param=spec.flag,
            )
        return self.register(kind, name, manager[name].plugin, info)

    def register(self, kind: str, name: str, module: ModuleType, info: PluginInfo | None = None) -> ModuleType:
        """Check the API version and register ``module`` with pluggy as ``<kind>:<name>``.

        Also the way tests and embedding applications add a plugin without installing a wheel.
        """
        spec = KINDS[kind]
        info = info or PluginInfo(kind, name, getattr(module, "__name__", repr(module)))
        declared = getattr(module, "FRAME_API_VERSION", None)
        if declared not in SUPPORTED_API_VERSIONS:
            what = "declares no FRAME_API_VERSION" if declared is None else f"was written for plugin API {declared}"
            changes = API_CHANGES.get(declared) if isinstance(declared, int) else None
            migrate = (f" ({changes}; see 'Migrating from API {declared}' in docs/plugins.md)" if changes else "")
            raise IncompatiblePluginError(
                f"The {kind} plugin '{name}' ({info.wheel}) {what}, but this frame implements API {API_VERSION}"
                f"{migrate}; install a release of it made for API {API_VERSION}.",
                param=spec.flag,
            )
        try:
            self.pm.register(module, name=f"{kind}:{name}")
            self.pm.check_pending()
        except pluggy.PluginValidationError as err:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            raise IncompatiblePluginError(
                f"The {kind} plugin '{name}' ({info.wheel}) does not match frame's hookspecs: {err}.", param=spec.flag
            ) from err
        if not any(impl.plugin_name == f"{kind}:{name}" for impl in getattr(self.pm.hook, spec.required_hook)
                   .get_hookimpls()):
            self.pm.unregister(module)
            raise IncompatiblePluginError(
                f"The {kind} plugin '{name}' ({info.wheel}) does not implement {spec.required_hook}, which every "
                f"{kind} plugin must.",
                param=spec.flag,
            )
        self._loaded[(kind, name)] = module
        if info.distribution is None:
            self._extra[(kind, name)] = info
        return module

    def unregister(self, kind: str, name: str) -> None:
        """Remove a registered plugin (tests use this to leave no trace)."""
        module = self._loaded.pop((kind, name), None)
        self._extra.pop((kind, name), None)
        if module is not None and self.pm.is_registered(module):
            self.pm.unregister(module)

    def load_all(self, kind: str) -> dict[str, ModuleType]:
        """Load every enabled plugin of ``kind``; failures go to :attr:`failures` and are skipped."""
        loaded: dict[str, ModuleType] = {}
        for name in self.names(kind):
            try:
                loaded[name] = self.load(kind, name)
            except (PluginImportError, IncompatiblePluginError) as err:
                self.failures[(kind, name)] = str(err)
        return loaded
