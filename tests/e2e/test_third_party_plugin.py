"""A third party ships a scheduler wheel: built with pip, installed, listed, used; a broken one beside it is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FRAME = [sys.executable, "-m", "frame.cli.main"]

GOOD_PLUGIN = '''
"""Last-in-first-out admission: a third-party scheduler policy."""

from frame import hookimpl
from frame.scheduling import PolicyScheduler

FRAME_API_VERSION = 1


class LifoScheduler(PolicyScheduler):
    def admission_order(self, waiting):
        return sorted(waiting, key=lambda s: -s.arrival_time)


@hookimpl
def frame_scheduler_create(limits, cache, options):
    return LifoScheduler(limits, cache)
'''

BROKEN_PLUGIN = '''
import not_a_real_dependency  # noqa: F401  (the point: this wheel forgot a dependency)

FRAME_API_VERSION = 1
'''


def _write_wheel_source(root: Path, name: str, code: str) -> Path:
    folder = root / f"frame-scheduler-{name}"
    package = folder / f"frame_scheduler_{name}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(code)
    (folder / "pyproject.toml").write_text(textwrap.dedent(f'''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "frame-scheduler-{name}"
        version = "1.2.3"
        dependencies = ["frame-engine>=0.1"]

        [project.entry-points."frame.schedulers"]
        {name} = "frame_scheduler_{name}.plugin"

        [tool.setuptools]
        packages = ["frame_scheduler_{name}"]
    '''))
    return folder


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("third_party")
    wheels, site = root / "wheels", root / "site"
    for name, code in (("lifo", GOOD_PLUGIN), ("broken", BROKEN_PLUGIN)):
        source = _write_wheel_source(root / "src", name, code)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "-w", str(wheels), str(source)], check=True)
    built = sorted(str(p) for p in wheels.glob("*.whl"))
    assert len(built) == 2
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), *built],
                   check=True)
    env = dict(os.environ, PYTHONPATH=str(site), XDG_CACHE_HOME=str(root / "xdg"))
    env.pop("FRAME_PLUGINS", None)
    return env


def test_listed_by_frame_plugins_and_the_broken_one_reported(plugin_env) -> None:
    out = subprocess.run([*FRAME, "plugins", "--json"], env=plugin_env, capture_output=True, text=True, check=True)
    rows = {(r["kind"], r["name"]): r for r in json.loads(out.stdout)}
    good = rows[("scheduler", "lifo")]
    assert (good["wheel"], good["version"], good["runs_here"]) == ("frame-scheduler-lifo", "1.2.3", True)
    broken = rows[("scheduler", "broken")]
    assert not broken["runs_here"]
    assert broken["why"] == (
        "The scheduler plugin 'broken' from wheel frame-scheduler-broken 1.2.3 failed to import "
        "(ModuleNotFoundError: No module named 'not_a_real_dependency'); reinstall that wheel or choose another of: "
        "fcfs, lifo, lpm, priority."
    )
    assert rows[("cache", "hashchain")]["runs_here"]


def test_generates_with_the_third_party_scheduler(plugin_env) -> None:
    out = subprocess.run(
        [*FRAME, "generate", "--prompt", "What is the capital of France?", "--sched", "lifo", "--max-tokens", "12",
         "--dtype", "float32", "--max-model-len", "256"],
        env=plugin_env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_selecting_the_broken_plugin_is_one_line_error(plugin_env) -> None:
    out = subprocess.run([*FRAME, "generate", "--prompt", "hi", "--sched", "broken"], env=plugin_env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: The scheduler plugin 'broken' from wheel frame-scheduler-broken 1.2.3 failed to import "
        "(ModuleNotFoundError: No module named 'not_a_real_dependency'); reinstall that wheel or choose another "
        "of: fcfs, lifo, lpm, priority."
    ]
