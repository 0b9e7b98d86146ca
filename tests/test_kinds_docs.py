"""Every list of the plugin kinds agrees with the one table in the code (frame.plugins.kinds.KINDS).

docs/plugins.md holds the table as generated; docs/architecture.md's contracts table, README.md's kinds sentence
and in-tree table, the ``frame_plugin_options`` docstring, the engine config's options sections, ``frame
new-plugin``'s kinds and ``frame plugins --kinds`` are each checked against it.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from pathlib import Path

from frame.cli.main import build_parser, main
from frame.config import OPTION_SECTIONS
from frame.hookspecs.common import frame_plugin_options
from frame.plugin_templates import TEMPLATES
from frame.plugins.kinds import KINDS, hooks_of, markdown_table

ROOT = Path(__file__).resolve().parents[1]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the Markdown table whose header line starts with ``header``."""
    lines = text[text.index(header):].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_kinds_section_of_the_plugin_guide_is_the_generated_table() -> None:
    text = (ROOT / "docs" / "plugins.md").read_text()
    assert markdown_table() in text, "regenerate the table under '## The kinds': frame.plugins.kinds.markdown_table()"


def test_the_architecture_contracts_table_has_every_kind_its_hooks_and_real_methods() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {row[0]: row for row in _table(text, "| kind | hooks")}
    assert sorted(rows) == sorted(KINDS)
    for name, (_, hooks, obj) in rows.items():
        kind = KINDS[name]
        assert sorted(re.findall(r"`(frame_\w+)`", hooks)) == sorted(hooks_of(kind)), name
        module = __import__(kind.interface, fromlist=["_"])
        assert obj.startswith(f"`{kind.base}`"), name
        named = [n for n in re.findall(r"`(\w+)`", obj) if not n[0].isupper()]
        # An interface may be a package (the cache's: strategy and values); its modules count as one.
        parts = [module] + [sys.modules[m] for m in sorted(sys.modules) if m.startswith(kind.interface + ".")]
        source = "".join(inspect.getsource(part) for part in parts)
        for method in named:  # a method or attribute the row names is defined in the interface module
            defined = rf"def {method}\b|self\.{method}\s*[:=]|^\s+{method}\s*:"
            assert re.search(defined, source, re.MULTILINE), f"{name}: {method} is not in {kind.interface}"
    groups = re.search(r"reads entry points \(([^)]*)\)", text).group(1)
    assert re.findall(r"`([\w.]+)`", groups) == [k.group for k in KINDS.values()]


def test_the_readme_names_every_kind_and_its_flag() -> None:
    text = (ROOT / "README.md").read_text()
    start, end = text.index("A small core defines the contracts"), text.index("found through entry")
    sentence = " ".join(text[start:end].split())
    for kind in KINDS.values():
        assert kind.title[:-1] in sentence, f"README's sentence of kinds lacks {kind.title}"
    rows = {row[0]: row for row in _table(text, "| kind | plugins | flag |")}
    assert sorted(rows) == sorted(k.title for k in KINDS.values())
    for kind in KINDS.values():
        flag = rows[kind.title][2]
        assert (f"`--{kind.flag}`" in flag) if kind.flag else ("architecture" in flag), kind.name


def test_the_options_hook_docstring_names_every_options_section() -> None:
    doc = " ".join((frame_plugin_options.__doc__ or "").split())
    for kind in KINDS.values():
        assert f"``{kind.options_key}`` (``{kind.options_flag}``" in doc, kind.name


def test_the_engine_configs_options_sections_are_the_tables() -> None:
    assert {k.name: k.options_key for k in KINDS.values() if k.engine_config} == OPTION_SECTIONS


def test_kinds_outside_the_engine_config_are_frame_bench_flags() -> None:
    """A workload is chosen and sized by `frame bench`'s own flags, not by engine config keys."""
    bench = _subcommands(_subcommands(build_parser())["bench"])
    for kind in (k for k in KINDS.values() if not k.engine_config):
        for name in ("throughput", "latency"):
            flags = {option for action in bench[name]._actions for option in action.option_strings}
            assert {f"--{kind.flag}", kind.options_flag} <= flags, (kind.name, name)


def test_new_plugin_and_frame_plugins_read_the_table(capsys) -> None:
    assert sorted(TEMPLATES) == sorted(KINDS)
    assert main(["plugins", "--kinds", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(k["name"], k["group"], k["options_flag"], k["suite"]) for k in listed] == [
        (k.name, k.group, k.options_flag, k.suite) for k in KINDS.values()]
