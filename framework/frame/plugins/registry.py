"""PluginRegistry: finds plugins through entry points (stevedore) and registers them with pluggy.

Listing reads entry-point metadata only; nothing is imported until a plugin is loaded by name. Loading checks the
declared ``FRAME_API_VERSION``, checks the hook implementations against the hookspecs, registers the module with
pluggy as ``<kind>:<name>`` and asks the kind's probing hooks (:attr:`PluginKind.probes`) once. Any failure on the
way (an import error, a wrong API version, a misspelled hook, a probe that raises) marks that plugin broken with a
one-sentence :class:`~frame.errors.PluginError` message: fatal when the plugin was asked for by name, recorded by
:meth:`load_all` otherwise, so one broken plugin never stops the others.

Escape hatches, read from the environment when the registry is built:

- ``FRAME_PLUGINS=a,b,cache:c``: only the named plugins load (a bare name matches any kind);
- ``FRAME_DISABLE_PLUGINS=a,b``: these never load;
- ``FRAME_TRACE_HOOKS=1``: every hook call is written to stderr, and the traceback of a probing hook that raised.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy
import stevedore

from frame.errors import (
    IncompatiblePluginError,
    PluginError,
    PluginImportError,
    PluginUnavailableError,
    UnknownPluginError,
)
from frame.hookspecs import PROJECT
from frame.plugins.calls import call_one, describe, implementers
from frame.plugins.kinds import KINDS, SHARED_SPECS
from frame.plugins.sources import source_plugins
from frame.plugins.validation import hookimpl_problem, missing_hook_problem
from frame.version import API_CHANGES, API_VERSION, SUPPORTED_API_VERSIONS


@dataclass(frozen=True)
class PluginInfo:
    """An installed plugin as its entry point describes it (nothing imported)."""

    kind: str
    name: str
    target: str
    distribution: str | None = None
    version: str | None = None
    #: The folder it was registered from with ``register_source_tree``, when it was.
    source: Path | None = None

    @property
    def origin(self) -> str:
        """Where the plugin comes from, for messages: ``wheel frame-cache-x 1.0``, a source tree, or in-process."""
        if self.source is not None:
            return f"the source tree of {self.distribution} {self.version} at {self.source}"
        if self.distribution is None:
            return "registered in-process"
        return f"wheel {self.distribution} {self.version}"


#: What :meth:`PluginRegistry._ask` returns when the hook raised.
_BROKE = object()


@dataclass(frozen=True)
class _Broken:
    """Why a plugin cannot be used: the sentence up to the fix, and the fix (None: ``sentence`` is complete)."""

    error: type[PluginError]
    sentence: str
    fix: str | None
    cause: BaseException | None
    #: What went wrong, as a phrase after the plugin's name ("its frame_model_architectures raised ValueError: x").
    reason: str = ""


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin found broken: where it comes from, what went wrong (a phrase), and what the user can do."""

    info: PluginInfo
    reason: str
    fix: str


def _names_from_env(variable: str) -> frozenset[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


def _owners(group: str) -> dict[str, tuple[str, str]]:
    """Entry-point name -> (distribution, version); stevedore's cached entry points do not carry them."""
    owners = {}
    for ep in importlib.metadata.entry_points(group=group):
        if ep.dist is not None:
            owners[ep.name] = (ep.dist.name, ep.dist.version)
    return owners


def _fix(info: PluginInfo, raised: bool = False) -> str:
    """What the user can do about a broken plugin, before "or choose another of"."""
    if info.source is not None or info.distribution is None:
        return "fix it"
    return "fix or reinstall that wheel," if raised else "reinstall that wheel"


def _import_target(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        found = getattr(found, part)
    return found


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
        self.tracing = trace if trace is not None else os.environ.get("FRAME_TRACE_HOOKS") == "1"
        if self.tracing:
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self._loaded: dict[tuple[str, str], ModuleType] = {}
        self._probed: set[tuple[str, str]] = set()
        self._extra: dict[tuple[str, str], PluginInfo] = {}
        self._broken: dict[tuple[str, str], _Broken] = {}

    # -- listing (no imports) -------------------------------------------------------------------------
    @staticmethod
    def refresh() -> None:
        """Forget cached entry points, e.g. after a wheel was installed while this process runs."""
        stevedore.ExtensionManager.ENTRY_POINT_CACHE.clear()

    def installed(self, kind: str) -> list[PluginInfo]:
        """Every plugin of ``kind`` that is installed, registered from a source tree or in-process, by name."""
        spec = KINDS[kind]
        manager = stevedore.NamedExtensionManager(spec.group, names=[])
        owners = _owners(spec.group)
        found = {ep.name: PluginInfo(kind, ep.name, ep.value, *owners.get(ep.name, (None, None)))
                 for ep in manager.list_entry_points()}
        found.update({p.name: PluginInfo(kind, p.name, p.target, p.distribution, p.version, p.root)
                      for p in source_plugins(kind)})
        found.update({name: info for (k, name), info in self._extra.items() if k == kind})
        return [found[name] for name in sorted(found)]

    def info(self, kind: str, name: str) -> PluginInfo:
        """The listing entry of one plugin (an unknown name gets the same error as :meth:`load`)."""
        for info in self.installed(kind):
            if info.name == name:
                return info
        spec = KINDS[kind]
        raise UnknownPluginError(
            f"No {kind} plugin named '{name}' is installed; choose one of: "
            f"{', '.join(self.names(kind)) or '(none installed)'} ({spec.how_to_choose}).",
            param=spec.param,
        )

    def disabled_reason(self, kind: str, name: str) -> str | None:
        """Why the escape hatches keep this plugin from loading, or None."""
        if name in self.disable or f"{kind}:{name}" in self.disable:
            return "it is listed in FRAME_DISABLE_PLUGINS"
        if self.allow is not None and name not in self.allow and f"{kind}:{name}" not in self.allow:
            return "it is not listed in FRAME_PLUGINS"
        return None

    def excluded_note(self, kind: str) -> str | None:
        """One sentence for a kind none of whose installed plugins may load because of the escape hatches (``None``
        when some may, or none is installed): the allow-list, not the machine, is then what is missing."""
        installed = [p.name for p in self.installed(kind)]
        if not installed or self.names(kind):
            return None
        hatch = "FRAME_PLUGINS" if self.allow is not None else "FRAME_DISABLE_PLUGINS"
        fix = (f"add the one you need to FRAME_PLUGINS (as {kind}:{installed[0]})" if self.allow is not None
               else "take them out of FRAME_DISABLE_PLUGINS")
        return (f"No {kind} plugin may load: {hatch} excludes every installed one ({', '.join(installed)}); {fix} "
                f"or unset the variable.")

    def names(self, kind: str) -> list[str]:
        """Names of the plugins of ``kind`` that may load here (installed and not disabled)."""
        return [p.name for p in self.installed(kind) if self.disabled_reason(kind, p.name) is None]

    # -- loading ----------------------------------------------------------------------------------------
    def is_loaded(self, kind: str, name: str) -> bool:
        return (kind, name) in self._loaded

    def load(self, kind: str, name: str) -> ModuleType:
        """Import, register and probe one plugin; raises a PluginError with a one-sentence message on failure."""
        module = self._ensure(kind, name)
        if module is None:
            broken = self._broken[(kind, name)]
            raise self._error(kind, name) from broken.cause
        return module

    def load_all(self, kind: str) -> dict[str, ModuleType]:
        """Load every enabled plugin of ``kind``; the broken ones are skipped (see :attr:`failures`)."""
        loaded = {name: self._ensure(kind, name) for name in self.names(kind)}
        return {name: module for name, module in loaded.items() if module is not None}

    @property
    def failures(self) -> dict[tuple[str, str], str]:
        """``(kind, name) -> one-sentence message`` for every plugin found broken so far."""
        return {key: str(self._error(*key)) for key in self._broken}

    def broken(self, kind: str) -> list[BrokenPlugin]:
        """The plugins of ``kind`` found broken so far (by :meth:`load_all` or a load by name), by name."""
        found = []
        for (k, name), broken in sorted(self._broken.items()):
            if k == kind:
                info = self.info(kind, name)
                found.append(BrokenPlugin(info, broken.reason or broken.sentence, broken.fix or _fix(info, True)))
        return found

    def probe(self, kind: str, name: str, hook: str) -> Any:
        """The plugin's answer now to one of its kind's probing hooks (None when it does not implement it).

        A plugin that raises in it is marked broken, as if it had raised at load: the PluginError says so.
        """
        self.load(kind, name)
        asked = self._ask(kind, name, hook)
        if asked is _BROKE:
            raise self._error(kind, name) from self._broken[(kind, name)].cause
        return asked

    def _ensure(self, kind: str, name: str) -> ModuleType | None:
        """The loaded and probed module, or None when the plugin is broken (recorded in ``_broken``)."""
        key = (kind, name)
        if key in self._broken:
            return None
        if key in self._probed:
            return self._loaded[key]
        info = self.info(kind, name)
        module = self._loaded.get(key)  # registered in-process: the escape hatches do not apply
        if module is None:
            reason = self.disabled_reason(kind, name)
            if reason is not None:
                raise UnknownPluginError(
                    f"The {kind} plugin '{name}' is installed but {reason}; add it there or unset the variable.",
                    param=KINDS[kind].param,
                )
            try:
                module = self._import(info)
                self.register(kind, name, module, info)
            except _ImportFailed as failed:
                reason = f"failed to import ({describe(failed.cause)})"
                self._broken[key] = _Broken(PluginImportError, f"The {kind} plugin '{name}' from {info.origin} "
                                            f"{reason}", _fix(info), failed.cause, reason)
                self.trace_raised(failed.cause)
                return None
            except PluginError as err:
                self._broken[key] = _Broken(type(err), str(err), None, err)
                return None
        if any(self._ask(kind, name, hook) is _BROKE for hook in KINDS[kind].probes):
            return None
        self._probed.add(key)
        return module

    def _ask(self, kind: str, name: str, hook: str) -> Any:
        """One registered plugin's answer to a probing hook, or ``_BROKE`` (and the plugin marked broken)."""
        try:
            answers = call_one(self.pm, f"{kind}:{name}", hook)
        except Exception as err:
            info = self.info(kind, name)
            self._drop((kind, name))
            reason = f"its {hook} raised {describe(err)}"
            self._broken[(kind, name)] = _Broken(PluginUnavailableError, f"The {kind} plugin '{name}' "
                                                 f"({info.origin}) cannot run here: {reason}",
                                                 _fix(info, raised=True), err, reason)
            self.trace_raised(err, f"{kind}:{name} {hook}")
            return _BROKE
        return answers[0] if answers else None

    def trace_raised(self, err: BaseException, where: str | None = None) -> None:
        """With ``FRAME_TRACE_HOOKS=1``: the exception a plugin raised, with its traceback, on stderr."""
        if self.tracing:
            if where is not None:  # pluggy's tracer shows the call, but not that it raised
                sys.stderr.write(f"  {where} raised {describe(err)}\n")
            traceback.print_exception(err, file=sys.stderr)

    def _import(self, info: PluginInfo) -> ModuleType:
        if info.source is not None:
            try:
                return _import_target(info.target)
            except Exception as err:
                raise _ImportFailed(err) from err
        errors: list[BaseException] = []
        manager = stevedore.NamedExtensionManager(
            KINDS[info.kind].group, names=[info.name],
            on_load_failure_callback=lambda _m, _ep, err: errors.append(err),
            on_missing_entrypoints_callback=lambda _names: None,  # reported by the caller, as one sentence
        )
        if errors or info.name not in manager.names():
            raise _ImportFailed(errors[0] if errors else ImportError("its entry point did not load"))
        return manager[info.name].plugin

    def _error(self, kind: str, name: str) -> PluginError:
        """The one-sentence error of a broken plugin; its hint lists only the others that load and can run here."""
        broken = self._broken[(kind, name)]
        if broken.fix is None:
            return broken.error(broken.sentence, param=KINDS[kind].param)
        others = ", ".join(self._usable_others(kind, name)) or "(none installed)"
        return broken.error(f"{broken.sentence}; {broken.fix} or choose another of: {others} "
                            f"({KINDS[kind].how_to_choose}).", param=KINDS[kind].param)

    def _usable_others(self, kind: str, name: str) -> list[str]:
        usable = []
        for other in self.names(kind):
            if other == name or self._ensure(kind, other) is None:
                continue
            if kind == "platform" and self._ask(kind, other, "frame_platform_check") is not None:
                continue  # its device is not here (or its check raised just now)
            usable.append(other)
        return usable

    # -- in-process registration ------------------------------------------------------------------------
    def register(self, kind: str, name: str, module: ModuleType, info: PluginInfo | None = None) -> ModuleType:
        """Check the API version and the hooks, and register ``module`` with pluggy as ``<kind>:<name>``.

        Also the way tests and embedding applications add a plugin without installing a wheel; its probing hooks
        are asked when it is first loaded (:meth:`load`, :meth:`load_all`).
        """
        spec = KINDS[kind]
        info = info or PluginInfo(kind, name, getattr(module, "__name__", repr(module)))
        plugin_name = f"{kind}:{name}"

        def refuse(problem: str) -> IncompatiblePluginError:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            end = "" if problem.endswith("?") else "."
            return IncompatiblePluginError(f"The {kind} plugin '{name}' ({info.origin}) {problem}{end}",
                                           param=spec.param)

        declared = getattr(module, "FRAME_API_VERSION", None)
        if declared not in SUPPORTED_API_VERSIONS:
            what = "declares no FRAME_API_VERSION" if declared is None else f"was written for plugin API {declared}"
            changes = API_CHANGES.get(declared) if isinstance(declared, int) else None
            migrate = f" ({changes}; see 'Migrating from API {declared}' in docs/plugins.md)" if changes else ""
            raise refuse(f"{what}, but this frame implements API {API_VERSION}{migrate}; install a release of it "
                         f"made for API {API_VERSION}")
        problem = hookimpl_problem(self.pm, module, plugin_name)
        if problem is not None:
            raise refuse(problem)
        try:
            self.pm.register(module, name=plugin_name)
            self.pm.check_pending()
        except (pluggy.PluginValidationError, ValueError) as err:
            raise refuse(f"does not match frame's hookspecs ({describe(err)})") from err
        required = (spec.required_hook, *spec.deprecated_hooks)  # an older name still counts
        if not any(plugin_name in implementers(self.pm, hook) for hook in required):
            raise refuse(missing_hook_problem(module, spec.required_hook, kind))
        self._loaded[(kind, name)] = module
        if info.distribution is None:
            self._extra[(kind, name)] = info
        return module

    def unregister(self, kind: str, name: str) -> None:
        """Remove a registered plugin and everything known about it (tests use this to leave no trace)."""
        self._drop((kind, name))
        self._extra.pop((kind, name), None)
        self._broken.pop((kind, name), None)

    def _drop(self, key: tuple[str, str]) -> None:
        """Take a plugin out of pluggy; it stays listed."""
        module = self._loaded.pop(key, None)
        self._probed.discard(key)
        if module is not None and self.pm.is_registered(module):
            self.pm.unregister(module)


class _ImportFailed(Exception):
    """A plugin's module did not import; ``cause`` is why."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause
