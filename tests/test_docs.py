"""Docs cannot drift: every hook, CLI command and config key appears in the docs as it really is."""

from __future__ import annotations

import inspect
from pathlib import Path

from frame.cli.engine_flags import OPTION_FLAGS
from frame.cli.main import COMMANDS
from frame.config import EngineConfig
from frame.plugins.kinds import KINDS, SHARED_SPECS

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
