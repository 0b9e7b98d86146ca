"""Plugins registered from their source tree, for this whole process: a plugin's tests run before it is installed.

A plugin folder's ``pyproject.toml`` declares its entry points. :func:`register_source_tree` reads them and makes
every :class:`~frame.plugins.registry.PluginRegistry` of this process list and load those plugins as if their
wheel were installed, importing the package from the folder. A source tree takes precedence over an installed
wheel of the same plugin name, so tests always run the code beside them. Scaffolds from ``frame new-plugin``
call it (through :mod:`frame.testing.registration`) from ``tests/conftest.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from frame.errors import FrameUsageError
from frame.plugins.kinds import KINDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class SourcePlugin:
    """One entry point of a plugin folder: ``target`` is ``module`` or ``module:attribute``."""

    kind: str
    name: str
    target: str
    distribution: str
    version: str
    root: Path


_REGISTERED: dict[tuple[str, str], SourcePlugin] = {}


def read_source_tree(root: Path) -> list[SourcePlugin]:
    """The frame plugins that the ``pyproject.toml`` in ``root`` declares."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise FrameUsageError(f"{root} has no pyproject.toml; pass the plugin's folder, the one holding it.")
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    kinds = {kind.group: kind.name for kind in KINDS.values()}
    found = [
        SourcePlugin(kinds[group], name, target, project.get("name", root.name), project.get("version", "0"), root)
        for group, entries in project.get("entry-points", {}).items() if group in kinds
        for name, target in entries.items()
    ]
    if not found:
        raise FrameUsageError(f"{pyproject} declares no frame plugin; add an entry point under "
                              f"[project.entry-points.\"frame.<kind>\"] (see docs/plugins.md).")
    return found


def register_source_tree(root: str | Path) -> Callable[[], None]:
    """Make the plugins of the folder ``root`` appear installed in this process; returns the function undoing it."""
    root = Path(root).resolve()
    plugins = read_source_tree(root)
    path = str(root)
    added = path not in sys.path
    if added:
        sys.path.insert(0, path)
    previous = {(p.kind, p.name): _REGISTERED.get((p.kind, p.name)) for p in plugins}
    _REGISTERED.update({(p.kind, p.name): p for p in plugins})

    def undo() -> None:
        for key, before in previous.items():
            if before is None:
                _REGISTERED.pop(key, None)
            else:
                _REGISTERED[key] = before
        if added and path in sys.path:
            sys.path.remove(path)

    return undo


def source_plugins(kind: str) -> list[SourcePlugin]:
    """The plugins of ``kind`` registered from source trees in this process."""
    return [p for (k, _), p in _REGISTERED.items() if k == kind]
