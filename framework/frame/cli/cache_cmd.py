"""``frame cache``: what frame keeps under ``$FRAME_CACHE_DIR``, which of it can never be read again, and pruning."""

from __future__ import annotations

import argparse
import shutil

from rich.console import Console
from rich.table import Table

from frame.derived_cache import KINDS, Entry, current_key, entries, folder_bytes, sweep, sweep_unused_builds
from frame.paths import cache_root


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prune", action="store_true",
                        help="remove the folders whose checkpoint file is gone or changed, and kernel builds not "
                             "loaded for a month (done anyway whenever frame converts a file or builds a kernel)")
    parser.add_argument("--clear", action="store_true",
                        help="remove every converted checkpoint and export (they are rebuilt on the next load)")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _table(rows: list[tuple[str, Entry]]) -> Table:
    table = Table(title=f"frame cache: {cache_root()}")
    for column in ("kind", "folder", "size", "from", "state"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for kind, entry in rows:
        state = (f"[red]stale: {entry.stale}[/red]" if entry.stale
                 else "[yellow]unrecorded (kept two weeks after its last change)[/yellow]" if entry.source is None
                 else "[green]live[/green]")
        table.add_row(kind, entry.folder.name, _gib(entry.bytes), entry.source or "?", state)
    return table


def run(args: argparse.Namespace) -> int:
    console = Console()
    root = cache_root()
    if args.clear:
        for kind in KINDS:
            shutil.rmtree(root / kind, ignore_errors=True)
        console.print(f"removed every converted checkpoint and export under {root}")
        return 0
    if args.prune:
        removed = [folder for kind in KINDS for folder in sweep(root / kind, current_key(kind))]
        builds = sweep_unused_builds(root / "kernels")
        console.print(f"removed {len(removed)} stale folder(s) and {len(builds)} kernel build(s) unused for a month "
                      f"under {root}")
    rows = [(kind, entry) for kind in KINDS for entry in entries(root / kind, current_key(kind))]
    console.print(_table(rows))
    stale = sum(e.bytes for _, e in rows if e.stale)
    others = {folder.name: folder_bytes(folder) for folder in sorted(root.iterdir()) if folder.is_dir()
              and folder.name not in KINDS} if root.is_dir() else {}
    console.print(f"{len(rows)} folder(s), {_gib(sum(e.bytes for _, e in rows))}, of which stale {_gib(stale)}"
                  + ("; run `frame cache --prune` to remove the stale ones" if stale else "") + "."
                  + (" Also: " + ", ".join(f"{name} {_gib(n)}" for name, n in others.items()) + "." if others else ""))
    return 0
