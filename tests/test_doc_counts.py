"""Counts the docs state in words agree with the code: benchmarks.md's "Six tools" lists six, among them every
`frame bench` command; experiments.md's in-tree routers and models.md's family hooks are as many as there are."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest
from frame.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NUMBERS = {word: n for n, word in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"])}


def _stated(page: str, pattern: str) -> int:
    """The number word that ``pattern``'s first group matches in ``page``, as a number."""
    found = re.search(pattern, " ".join((DOCS / page).read_text().split()), re.I)
    assert found, f"docs/{page} no longer says {pattern!r}; update this test with it"
    return NUMBERS[found.group(1).lower()]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _tools_table() -> tuple[int, list[str]]:
    """benchmarks.md's stated number of tools, and the first cell of each row of the table under it."""
    text = (DOCS / "benchmarks.md").read_text()
    found = re.search(r"\b(\w+) tools:\n\n((?:\|.*\n)+)", text)
    assert found, "docs/benchmarks.md no longer says 'N tools:' above a table"
    rows = found.group(2).strip().splitlines()[2:]  # past the header and the separator
    return NUMBERS[found.group(1).lower()], [row.split("|")[1].strip() for row in rows]


def test_benchmarks_md_lists_as_many_tools_as_it_says_and_every_bench_command() -> None:
    stated, tools = _tools_table()
    assert stated == len(tools), f"docs/benchmarks.md says {stated} tools and lists {len(tools)}"
    commands = _subcommands(_subcommands(build_parser())["bench"])
    for name in commands:
        assert f"`frame bench {name}`" in tools, f"frame bench {name} is missing from docs/benchmarks.md's tools"
    for tool in tools:
        path = re.fullmatch(r"`(benchmarks/\S+)`", tool)
        command = re.fullmatch(r"`frame bench (\w+)`", tool)
        assert (path and (ROOT / path.group(1)).is_file()) or (command and command.group(1) in commands) or \
            tool.startswith("`frame bench --config"), f"docs/benchmarks.md lists {tool}, which does not exist"


@pytest.mark.parametrize(("page", "pattern", "actual"), [
    ("experiments.md", r"the (\w+) in-tree routers",
     lambda: len([d for d in (ROOT / "plugins" / "routers").iterdir() if (d / "pyproject.toml").is_file()])),
    ("models.md", r"into the (\w+) hooks", lambda: len(dataclasses.fields(_family_hooks()))),
])
def test_stated_counts_match_the_code(page: str, pattern: str, actual) -> None:
    assert _stated(page, pattern) == actual(), f"docs/{page}: {pattern!r} states another count than the code has"


def _family_hooks() -> type:
    from frame.layers.family import FamilyHooks

    return FamilyHooks
