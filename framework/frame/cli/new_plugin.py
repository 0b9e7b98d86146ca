"""``frame new-plugin``: write the skeleton of a plugin wheel (pyproject, README, package, conformance tests).

The scheduler skeleton is a complete plugin (an arrival-order policy over PolicyScheduler) that passes the
conformance suite as written; the other kinds get their contract's methods with docstrings to fill in, wired to
the hooks and the kind's conformance suite, so ``pytest`` shows what remains.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from frame.errors import FrameUsageError
from frame.plugin_templates import TEMPLATES
from frame.plugins.kinds import KINDS


def write_skeleton(kind: str, name: str, root: Path) -> Path:
    """Write the plugin folder ``root/frame-<kind>-<name>`` and return it."""
    if kind not in KINDS:
        raise FrameUsageError(f"Unknown plugin kind '{kind}'; choose one of: {', '.join(KINDS)}.", param="kind")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise FrameUsageError(f"Plugin name '{name}' must be lowercase letters, digits and underscores.",
                              param="name")
    spec = KINDS[kind]
    wheel = f"frame-{kind}-{name.replace('_', '-')}"
    package = f"frame_{kind}_{name}"
    folder = root / wheel
    if folder.exists():
        raise FrameUsageError(f"{folder} already exists; choose another name or remove it.", param="name")
    values = {"kind": kind, "name": name, "wheel": wheel, "package": package, "group": spec.group,
              "flag": spec.flag, "class_name": "".join(p.capitalize() for p in name.split("_")) + kind.capitalize()}
    template = TEMPLATES[kind]
    files = {
        "pyproject.toml": PYPROJECT,
        "README.md": README,
        f"{package}/__init__.py": '"""{wheel}: a frame {kind} plugin."""\n',
        f"{package}/plugin.py": template["plugin"],
        "tests/test_conformance.py": template["tests"],
    }
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(**values))
    return folder


PYPROJECT = '''[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{wheel}"
version = "0.1.0"
description = "A frame {kind} plugin."
requires-python = ">=3.10"
dependencies = ["frame-engine>=0.1"]

[project.entry-points."{group}"]
{name} = "{package}.plugin"

[tool.setuptools]
packages = ["{package}"]
'''

README = '''# {wheel}

A frame {kind} plugin.

- Install: `pip install -e .` (or build a wheel with `pip wheel --no-deps .`)
- Select it: `frame generate --{flag} {name} ...` / `LLM({flag}="{name}")` where applicable
- Check it is seen: `frame plugins`
- Test it: `pytest tests` (runs frame's {kind} conformance suite against this plugin)
'''


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", required=True, choices=sorted(KINDS), help="the plugin kind")
    parser.add_argument("--name", required=True, help="the plugin's name (what users select it by)")
    parser.add_argument("--dir", default=".", help="where to create the plugin folder")


def run(args: argparse.Namespace) -> int:
    folder = write_skeleton(args.kind, args.name, Path(args.dir))
    print(f"wrote {folder}; next: pip install -e {folder} && pytest {folder}/tests")
    return 0
