"""`frame new-plugin` writes a wheel skeleton; the scheduler one is complete and passes the conformance suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from frame.cli.new_plugin import write_skeleton
from frame.errors import FrameUsageError
from frame.plugins.kinds import KINDS
from frame.plugins.registry import PluginRegistry


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skeleton_files_and_entry_point(kind: str, tmp_path: Path) -> None:
    folder = write_skeleton(kind, "demo", tmp_path)
    assert folder.name == f"frame-{kind}-demo"
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    assert meta["project"]["name"] == f"frame-{kind}-demo"
    assert meta["project"]["entry-points"][KINDS[kind].group] == {"demo": f"frame_{kind}_demo.plugin"}
    assert (folder / "README.md").read_text().startswith(f"# frame-{kind}-demo")
    # The plugin module imports and its hooks validate against frame's hookspecs.
    sys.path.insert(0, str(folder))
    try:
        module = __import__(f"frame_{kind}_demo.plugin", fromlist=["plugin"])
        registry = PluginRegistry()
        registry.register(kind, "demo", module)
        registry.unregister(kind, "demo")
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.startswith(f"frame_{kind}_demo")]:
            del sys.modules[name]


def test_scheduler_skeleton_passes_the_conformance_suite(tmp_path: Path) -> None:
    folder = write_skeleton("scheduler", "demo", tmp_path)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(folder)], check=True)
    env_path = f"{site}"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / "tests")],
        capture_output=True, text=True, cwd=folder, env={**__import__("os").environ, "PYTHONPATH": env_path},
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert " passed" in result.stdout


def test_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FrameUsageError, match="must be lowercase"):
        write_skeleton("cache", "My-Cache", tmp_path)
    write_skeleton("cache", "dup", tmp_path)
    with pytest.raises(FrameUsageError, match="already exists"):
        write_skeleton("cache", "dup", tmp_path)
