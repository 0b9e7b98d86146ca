"""Every plugin wheel ships the native sources its kernels are built from (headers included)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
NATIVE = sorted(p for p in ROOT.glob("plugins/*/*/*/csrc") if p.is_dir())


@pytest.mark.parametrize("csrc", NATIVE, ids=lambda p: p.parent.name)
def test_package_data_covers_every_native_source(csrc: Path) -> None:
    plugin = csrc.parents[1]
    package = csrc.parent.name
    patterns = tomllib.loads((plugin / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][package]
    for source in csrc.iterdir():
        relative = source.relative_to(csrc.parent).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{plugin.name}'s wheel would miss {relative}"


def test_the_plugins_with_native_sources_are_found() -> None:
    assert {p.parent.name for p in NATIVE} >= {"frame_attention_cpu_paged", "frame_platform_cpu"}


def test_every_plugin_depends_on_the_core_by_its_own_name() -> None:
    # `frame` on PyPI is an unrelated web framework: a plugin declaring it would pull that in beside the core.
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == "frame-engine"
    for pyproject in sorted(ROOT.glob("plugins/*/*/pyproject.toml")):
        requires = [Requirement(r) for r in tomllib.loads(pyproject.read_text())["project"]["dependencies"]]
        cores = [str(r) for r in requires if r.name in ("frame", "frame-engine")]
        assert cores == ["frame-engine>=0.1"], f"{pyproject.parent.name} depends on {cores}"


def test_the_cpu_extra_is_the_minimal_runnable_set_of_in_tree_wheels() -> None:
    """`pip install "frame-engine[cpu]"` pulls one plugin of each kind a generation needs, each an in-tree wheel
    (the fresh-venv test in tests/e2e/test_third_party_plugin.py installs it from a folder of wheels)."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    wheels = {tomllib.loads(p.read_text())["project"]["name"] for p in ROOT.glob("plugins/*/*/pyproject.toml")}
    named = [Requirement(r).name for r in extra]
    assert named == ["frame-platform-cpu", "frame-attention-sdpa", "frame-cache-hashchain", "frame-scheduler-fcfs",
                     "frame-model-llama"]
    assert set(named) <= wheels


def test_the_default_models_path_is_public() -> None:
    import frame
    from frame.model_source import ModelSource

    assert "default_model_path" in frame.__all__
    assert frame.default_model_path().is_file() and frame.default_model_path() == ModelSource.open(None).path
