"""A rich progress bar over a WeightSource's tensors, drawn only when stderr is a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")


def track_tensors(items: Iterable[T], total: int, description: str) -> Iterator[T]:
    """Yield ``items`` unchanged, advancing a progress bar of ``total`` steps on an interactive stderr."""
    if not sys.stderr.isatty():
        yield from items
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task(description, total=total)
        for item in items:
            yield item
            progress.advance(task)
