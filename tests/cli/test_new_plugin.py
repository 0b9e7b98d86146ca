"""`frame new-plugin` writes a wheel skeleton: ruff-clean, its README gives the isolated commands, and its tests
run before it is installed: every kind's skeleton is a small working plugin whose conformance suite passes as
written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
import tomllib
from frame.cli.new_plugin import write_skeleton
from frame.errors import FrameUsageError
from frame.plugin_templates import TEMPLATES
from frame.plugins.kinds import KINDS
from frame.plugins.registry import PluginRegistry
from frame.version import API_VERSION

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_skeleton_files_and_entry_point(kind: str, tmp_path: Path) -> None:
    folder = write_skeleton(kind, "demo", tmp_path)
    package = f"frame_{kind}_demo"
    assert folder.name == f"frame-{kind.replace('_', '-')}-demo"
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert written == sorted(["README.md", "pyproject.toml", "tests/conftest.py", "tests/test_conformance.py",
                              f"{package}/__init__.py", f"{package}/plugin.py",
                              f"{package}/{TEMPLATES[kind].module}.py"])
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    assert meta["project"]["name"] == f"frame-{kind.replace('_', '-')}-demo"
    assert meta["project"]["dependencies"] == ["frame-engine>=0.1"]
    assert meta["project"]["entry-points"][KINDS[kind].group] == {"demo": f"{package}.plugin"}
    assert f"\nFRAME_API_VERSION = {API_VERSION}\n" in (folder / package / "plugin.py").read_text()
    # The plugin module imports and its hooks validate against frame's hookspecs.
    sys.path.insert(0, str(folder))
    try:
        module = __import__(f"{package}.plugin", fromlist=["plugin"])
        registry = PluginRegistry()
        registry.register(kind, "demo", module)
        registry.unregister(kind, "demo")
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.startswith(package)]:
            del sys.modules[name]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_readme_gives_the_isolated_commands(kind: str, tmp_path: Path) -> None:
    readme = (write_skeleton(kind, "demo", tmp_path) / "README.md").read_text()
    assert readme.startswith(f"# frame-{kind.replace('_', '-')}-demo\n")
    requirements = " ".join(("frame-engine", "pytest", *TEMPLATES[kind].test_requires))
    wheel = f"frame-{kind.replace('_', '-')}-demo"
    for command in ("python -m venv .venv", f"pip install {requirements}\npytest\n", "pip wheel --no-deps -w dist .",
                    f"pip install dist/frame_{kind}_demo-0.1.0-py3-none-any.whl", "frame plugins",
                    f"pip index versions {wheel}", "python -m build", "twine upload dist/*"):
        assert command in readme, command
    assert "--model-family" not in readme and "model-family" not in readme
    if KINDS[kind].flag:
        assert f"--{KINDS[kind].flag} demo" in readme
        if KINDS[kind].scope == "engine":  # not the API server's option (tool_parser) nor frame bench's (workload)
            assert f'LLM({KINDS[kind].param}="demo")' in readme


def test_skeletons_are_ruff_clean_under_frames_own_rules(tmp_path: Path) -> None:
    folders = [write_skeleton(kind, "demo_plugin", tmp_path) for kind in sorted(KINDS)]
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    for folder in folders:
        theirs = tomllib.loads((folder / "pyproject.toml").read_text())["tool"]["ruff"]
        assert {k: v for k, v in ours.items() if k != "extend-exclude"} == theirs
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *map(str, folders)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_skeleton_passes_its_conformance_suite_before_it_is_installed(kind: str, tmp_path: Path) -> None:
    """Each skeleton is a small working plugin: its own tests pass as written, nothing of the suite skipped, with
    the folder neither installed nor on the path (its conftest registers it from the source tree)."""
    folder = write_skeleton(kind, "demo", tmp_path)
    assert "demo" not in PluginRegistry().names(kind)
    report = tmp_path / "report.xml"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             f"--junitxml={report}"], capture_output=True, text=True, cwd=folder, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    cases = list(ElementTree.parse(report).iter("testcase"))
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert cases and not skipped, skipped


def test_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FrameUsageError, match="must be lowercase"):
        write_skeleton("cache", "My-Cache", tmp_path)
    write_skeleton("cache", "dup", tmp_path)
    with pytest.raises(FrameUsageError, match="already exists"):
        write_skeleton("cache", "dup", tmp_path)
