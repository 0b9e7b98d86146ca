"""Docs cannot drift: every hook, CLI command and config key appears in the docs as it really is."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import pytest
import yaml
from frame.bench.experiment import ExperimentSpec
from frame.cli.engine_flags import OPTION_FLAGS
from frame.cli.main import COMMANDS
from frame.config import OPTION_SECTIONS, EngineConfig, build_config, resolve_plugin_options
from frame.engine.selection import select_platform
from frame.errors import FrameUsageError
from frame.plugins.hooks import PluginHooks
from frame.plugins.kinds import KINDS, SHARED_SPECS
from frame.plugins.public import PUBLIC_MODULES, is_public
from frame.plugins.registry import PluginRegistry

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _hooks() -> list[tuple[str, list[str]]]:
    found = []
    for module in [k.specs for k in KINDS.values()] + list(SHARED_SPECS):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("frame_"):
                found.append((name, list(inspect.signature(fn).parameters)))
    return found


def test_every_hook_is_documented_with_its_signature() -> None:
    text = (DOCS / "plugins.md").read_text()
    for name, params in _hooks():
        assert f"`{name}({', '.join(params)})`" in text, f"{name} is missing from docs/plugins.md"


def test_every_hookspec_has_a_docstring_that_says_since_when() -> None:
    for module in [k.specs for k in KINDS.values()] + list(SHARED_SPECS):
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("frame_"):
                assert fn.__doc__ and "Since API" in fn.__doc__, name


def test_every_command_and_config_key_is_in_the_cli_reference() -> None:
    text = (DOCS / "cli.md").read_text()
    for command in COMMANDS:
        assert f"`frame {command}" in text, f"frame {command} is missing from docs/cli.md"
    for key in EngineConfig.model_fields:
        flag = OPTION_FLAGS.get(key, "--" + key.replace("_", "-"))
        assert f"`{key}`" in text and f"`{flag}" in text, f"{key} / {flag} missing from docs/cli.md"


ROOT = DOCS.parent
#: Options flags of kinds that are not engine config (a workload's ``--workload-opt``, a `frame bench` flag; the
#: kinds tests check that `frame bench` has them).
BENCH_OPTION_FLAGS = {k.options_flag for k in KINDS.values() if not k.engine_config}
#: Pages that describe the engine config, and the hook contracts, where config keys must be real ones.
CONFIG_PAGES = [DOCS / "plugins.md", DOCS / "cli.md", DOCS / "architecture.md", DOCS / "caches.md", ROOT / "README.md"]


def _hookspec_docstrings() -> list[str]:
    return [fn.__doc__ or "" for module in [k.specs for k in KINDS.values()] + list(SHARED_SPECS)
            for name, fn in inspect.getmembers(module, inspect.isfunction) if name.startswith("frame_")]


def _selected(hooks: PluginHooks, config: EngineConfig, kind: str) -> str:
    name = getattr(config, {"platform": "platform", "attention": "attn", "cache": "cache", "scheduler": "sched"}[kind])
    return select_platform(hooks, "auto") if (kind, name) == ("platform", "auto") else name


def test_yaml_examples_use_real_keys() -> None:
    hooks = PluginHooks(PluginRegistry())
    blocks = [(page, block) for page in [*DOCS.glob("*.md"), ROOT / "README.md"]
              for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)]
    assert blocks
    for page, block in blocks:
        values = yaml.safe_load(block)
        try:
            if "workloads" in values:  # an experiment file: its engine and matrix keys are engine config keys
                build_config(ExperimentSpec(**values).engine)
                continue
            config = build_config(values)
            for kind, section in OPTION_SECTIONS.items():
                if values.get(section):
                    name = _selected(hooks, config, kind)
                    resolve_plugin_options(kind, name, values[section], hooks.options_model(kind, name))
        except FrameUsageError as err:
            pytest.fail(f"{page.name}: {err}")


def test_config_keys_named_in_docs_and_hookspecs_exist() -> None:
    texts = [page.read_text() for page in CONFIG_PAGES] + _hookspec_docstrings()
    for text in texts:
        for section in re.findall(r"\b([a-z]+_options)\b", text):
            assert section in EngineConfig.model_fields, f"{section} is not a config key"
        for flag in re.findall(r"(--[a-z]+-opt)\b", text):
            assert flag in OPTION_FLAGS.values() or flag in BENCH_OPTION_FLAGS, f"{flag} is not a flag"
        for key in re.findall(r"`+([a-z_]+): [{\[]", text):  # inline YAML such as `cache_options: {...}`
            # `speculative: {...}` is the one mapping a config file may use for several keys (speculative_*).
            assert key in EngineConfig.model_fields or key == "speculative", f"inline YAML key {key} is no config key"


def test_the_public_module_list_is_the_codes() -> None:
    text = (DOCS / "plugins.md").read_text()
    sentence = re.search(r"Import only the core's public API: (.*?)\(and their submodules\)", text, re.S)
    assert sentence, "docs/plugins.md lost its list of public modules"
    assert tuple(re.findall(r"`(frame[a-z_.]*)`", sentence.group(1))) == PUBLIC_MODULES


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports; ``from frame import native`` counts as ``frame.native``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
    return found


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # the parent is not a package
        return False


def test_in_tree_plugins_import_only_public_modules() -> None:
    packages = sorted(p for p in ROOT.glob("plugins/*/*/frame_*") if p.is_dir())
    assert len(packages) >= 10
    used = set()
    for package in packages:
        for path in package.rglob("*.py"):
            for module in _imports(path):
                if module == "frame" or module.startswith("frame."):
                    assert is_public(module), f"{path.relative_to(ROOT)} imports {module}, which is not public"
                    used.add(module)
    assert {"frame.layers", "frame.native"} <= used
