"""The engine's rooms stay apart: no import circles in the core, each room imports only the rooms below it, the
API side runs without torch, and one module builds the wire's codec.

Rooms, lowest first (docs/architecture.md): ``wire`` (messages and the codec), then ``process`` and
``selection``, then ``worker`` (a model rank), then ``core`` (the engine loop and executors), then ``client``
(the API side). Imports are read from the source (module level and inside functions; ``TYPE_CHECKING`` blocks
are annotations only and do not count).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

FRAMEWORK = Path(__file__).resolve().parents[1] / "framework"
ENGINE_ROOMS = {"wire": 0, "process": 1, "selection": 1, "worker": 2, "core": 3, "client": 4}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(FRAMEWORK).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in (FRAMEWORK / "frame").rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """The frame modules ``path`` imports anywhere in its code, annotations-only blocks aside."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("frame"))
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").startswith("frame"):
                submodules = {f"{child.module}.{a.name}" for a in child.names} & MODULES.keys()
                found.update(submodules)
                if len(submodules) < len(child.names):  # names defined in the module itself
                    found.add(child.module)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in MODULES}


GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["frame", "engine"] else None


def test_the_core_has_no_import_circles() -> None:
    assert _cycles(GRAPH) == []


def test_each_engine_room_imports_only_the_rooms_below_it() -> None:
    upward = [
        f"{importer} -> {imported}"
        for importer, targets in sorted(GRAPH.items()) if (room := _room(importer)) in ENGINE_ROOMS
        for imported in sorted(targets) if (other := _room(imported)) in ENGINE_ROOMS
        and ENGINE_ROOMS[other] > ENGINE_ROOMS[room]
    ]
    assert upward == []


def test_the_server_reaches_the_engine_only_through_the_client_and_the_wire() -> None:
    crossing = [
        f"{importer} -> {imported}"
        for importer, targets in sorted(GRAPH.items()) if importer.startswith("frame.server")
        for imported in sorted(targets) if _room(imported) not in (None, "client", "wire", "process")
    ]
    assert crossing == []


def test_one_module_builds_the_codec() -> None:
    """Every message that crosses a process (engine core, model workers, chat-template workers) goes through it."""
    builders = sorted(
        name for name, path in MODULES.items()
        if "msgpack.Encoder(" in path.read_text() or "msgpack.Decoder(" in path.read_text()
    )
    assert builders == ["frame.engine.wire.codec"]


@pytest.mark.parametrize("modules", [
    ["frame.server.app", "frame.engine.client", "frame.engine.client.mp", "frame.engine.client.async_engine",
     "frame.engine.client.dp", "frame.engine.client.output_processor"],
    ["frame.cli.main"],
])
def test_the_api_side_imports_no_torch(modules: list[str]) -> None:
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "from frame.cli.main import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_core_module_builds_attention_metadata() -> None:
    builders = sorted(name for name, path in MODULES.items() if "AttentionMetadata(" in path.read_text())
    assert builders == ["frame.interfaces.kv_layout"]
