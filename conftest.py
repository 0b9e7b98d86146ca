"""Suite-wide hygiene, for every test folder (tests/ and each plugin's tests/)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc

import pytest


def _release_freed_memory() -> None:
    """Collect cycles, then hand glibc's freed heap pages back to the kernel: a test worker loads many models in
    turn, and without this each one's freed pages stayed in its RSS (two workers share a 24 GiB host)."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc is not None:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)  # glibc only
        if trim is not None:
            trim(0)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a test file's last test (its module fixtures are torn down by then)."""
    if nextitem is None or nextitem.path != item.path:
        _release_freed_memory()
