"""Suite-wide hygiene, for every test folder (tests/ and each plugin's tests/)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable

import pytest


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere), looked up once: find_library runs ldconfig."""
    libc = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc is not None else None


_TRIM = _malloc_trim()


def _release_freed_memory() -> None:
    """Collect cycles, then hand glibc's freed heap pages back to the kernel: a test worker loads many models in
    turn, and without this each one's freed pages stayed in its RSS (two workers share a 24 GiB host)."""
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test file's last test (its module fixtures are torn down by then)."""
    if nextitem is None or nextitem.path != item.path:
        _release_freed_memory()
