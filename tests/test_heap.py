"""frame.heap: freed heap pages go back to the system after a burst (glibc's malloc_trim)."""

from __future__ import annotations

import sys
import time

import pytest
from frame.heap import IdleTrim, trim_heap


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_a_trim_returns_the_pages_a_burst_freed():
    trim_heap()
    # 60 MB in 4 KiB pieces (malloc, not pymalloc), every 64th kept: the heap's top stays in use, so glibc's own
    # trimming of the top cannot give the freed middle back; only malloc_trim does.
    pieces = [bytes(4000) for _ in range(15_000)]
    kept = pieces[::64]
    before = _rss_mb()
    del pieces
    freed = _rss_mb()
    assert trim_heap()
    after = _rss_mb()
    assert before - freed < 10, (before, freed)  # free() alone kept the pages
    assert freed - after > 30, (before, freed, after)
    assert kept


def test_idle_trim_trims_once_per_burst_after_the_quiet_time():
    trim = IdleTrim(idle_s=0.05)
    assert not trim.maybe()  # no work yet
    trim.busy()
    assert not trim.maybe()  # not quiet long enough
    time.sleep(0.06)
    trim.maybe()
    assert trim.trims == 1 and not trim.maybe() and trim.trims == 1
