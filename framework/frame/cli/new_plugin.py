"""``frame new-plugin``: write the skeleton of a plugin wheel (pyproject, README, package, conformance tests).

Every skeleton is a small working plugin of the current API whose conformance suite passes as written, before any
edit and before install: an arrival-order scheduler, a paged allocator that reuses nothing, a plain-torch reference
attention backend, a host-CPU platform, a Llama-shaped model family on ``frame.layers`` for a made-up architecture,
and so on for every kind of :data:`frame.plugins.kinds.KINDS`. The author changes what the plugin does and keeps
the tests green. ``tests/conftest.py`` registers the folder's plugin with frame for the test session, so the
tests run before the wheel is installed. Every file is clean under the ``ruff`` settings the skeleton's pyproject
carries, which are frame's own.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from frame.errors import FrameUsageError
from frame.plugin_templates import TEMPLATES
from frame.version import API_VERSION

PYPROJECT = '''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{wheel}"
version = "0.1.0"
description = "A frame {kind} plugin."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["frame-engine>=0.1"]

[project.entry-points."{group}"]
{name} = "{package}.plugin"

[tool.setuptools]
packages = ["{package}"]

[tool.pytest.ini_options]
testpaths = ["tests"]

[tool.ruff]
line-length = 120
target-version = "py310"

[tool.ruff.lint]
select = ["E", "F", "W", "I", "B", "UP", "SIM", "RUF"]
ignore = ["RUF001", "RUF002", "RUF003", "B008"]
'''

README = '''# {wheel}

A frame {kind} plugin: say here what it does and why one would choose it.

## Select it

{select}

## Where it runs

{runs}

## Its contract

A {title} is found through the entry-point group `{group}` (see `pyproject.toml`); its object subclasses
`{base}` from `{interface}`, and `tests/test_conformance.py` subclasses `{suite}`. {options}
`frame plugins --kinds` lists every kind.

## Test it, before installing it

In a virtual environment of its own (not frame's):

```sh
python -m venv .venv
. .venv/bin/activate
pip install {test_requires}
pytest
```

The tests run frame's {kind} conformance suite against this plugin. `tests/conftest.py` registers this folder's
plugin with frame for the test session, so they run against the source tree before the wheel is built or
installed (`pip install -e .` installs it in editable mode while you work on it).

## Build it, install it, see it

```sh
pip wheel --no-deps -w dist .
pip install dist/{package}-0.1.0-py3-none-any.whl
frame plugins
```

`frame plugins` lists `{name}` among the {kind} plugins, with this wheel's name and version and whether it can run
on this machine.

## Publish it

```sh
pip index versions {wheel}    # "No matching distribution found": the name is free on PyPI
pip install build twine
python -m build
twine upload dist/*
```
'''

CONFTEST = '''"""Registers this folder's plugin with frame for the test session, so its tests run before it is built."""

from pathlib import Path

import pytest
from frame.testing.registration import register_source_tree


def pytest_configure(config: pytest.Config) -> None:
    config.add_cleanup(register_source_tree(Path(__file__).resolve().parents[1]))
'''


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def write_skeleton(kind: str, name: str, root: Path) -> Path:
    """Write the plugin folder ``root/frame-<kind>-<name>`` and return it."""
    from frame.plugins.kinds import KINDS  # imports torch: only once a skeleton is written, not for `frame --help`

    if kind not in KINDS:
        raise FrameUsageError(f"Unknown plugin kind '{kind}'; choose one of: {', '.join(KINDS)}.", param="kind")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise FrameUsageError(f"Plugin name '{name}' must be lowercase letters, digits and underscores.",
                              param="name")
    wheel = f"frame-{kind.replace('_', '-')}-{name.replace('_', '-')}"
    package = f"frame_{kind}_{name}"
    folder = root / wheel
    if folder.exists():
        raise FrameUsageError(f"{folder} already exists; choose another name or remove it.", param="name")
    template, spec = TEMPLATES[kind], KINDS[kind]
    values = {"kind": kind, "name": name, "wheel": wheel, "package": package, "group": spec.group,
              "title": spec.title, "base": spec.base, "interface": spec.interface,
              "suite": spec.suite.replace(":", "."), "options_key": spec.options_key,
              "options_flag": spec.options_flag, "api_version": API_VERSION,
              "camel": _camel(name), "class_name": _camel(name) + _camel(kind),
              "architecture": f"{_camel(name)}SkeletonForCausalLM", "model_type": f"{name}_skeleton",
              "test_requires": " ".join(("frame-engine", "pytest", *template.test_requires))}
    values["select"] = template.select.format(**values)
    values["runs"] = template.runs
    options = template.options or ("Options it declares with a `frame_plugin_options` model are given as "
                                   "`{options_key}` in a config file or `{options_flag} KEY=VALUE` on the command "
                                   "line.")
    values["options"] = options.format(**values)
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"{package}/__init__.py": '"""{wheel}: a frame {kind} plugin."""\n',
        f"{package}/plugin.py": template.plugin,
        f"{package}/{template.module}.py": template.implementation,
        "tests/conftest.py": CONFTEST,
        "tests/test_conformance.py": template.tests,
    }
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(**values))
    return folder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", required=True, choices=sorted(TEMPLATES), help="the plugin kind")
    parser.add_argument("--name", required=True, help="the plugin's name (what users select it by)")
    parser.add_argument("--dir", default=".", help="where to create the plugin folder")


def run(args: argparse.Namespace) -> int:
    folder = write_skeleton(args.kind, args.name, Path(args.dir))
    template = TEMPLATES[args.kind]
    print(f"wrote {folder}; fill in frame_{args.kind}_{args.name}/{template.module}.py, then follow its "
          f"README.md: test it in a venv of its own before installing it, build the wheel, see it in frame plugins")
    return 0
