"""`frame plugins` in an 80-column terminal keeps its notes readable: the wheel and version columns give way (the
title says where they are) instead of squeezing the notes to a word a line."""

from __future__ import annotations

import os
import subprocess
import sys


def _table(columns: int) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "plugins"], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COLUMNS": str(columns)})
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_narrow_terminals_drop_wheel_and_version_for_the_notes() -> None:
    lines = _table(80)
    header = next(line for line in lines if "kind" in line and "notes" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")] == ["kind", "name", "runs here", "notes"]
    assert len(header.split("┃")[-2]) >= 30  # the notes cell
    assert "wider terminal or --json" in lines[0]
    assert all(len(line) <= 80 for line in lines)


def test_wide_terminals_show_every_column() -> None:
    header = next(line for line in _table(160) if "kind" in line and "notes" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")] == ["kind", "name", "wheel", "version",
                                                                          "runs here", "notes"]
