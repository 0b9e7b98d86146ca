"""Memory that comes back: glibc's ``malloc_trim`` once a process goes idle after work.

glibc keeps freed memory in its arenas' free lists (one arena per thread that allocated), so after a burst of large
requests (a 4 MiB body, a compiled grammar, a long conversation) resident memory stays at its peak although Python
freed everything. :class:`IdleTrim` (the engine loop) calls ``malloc_trim(0)`` once the process has been idle for
``idle_s`` after any work, returning those pages to the system, at most once per burst;
:func:`trim_while_serving` (the API server) trims every two seconds without a request in flight. A trim costs
milliseconds. On a libc
without ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import time
from collections.abc import Callable

_libc: ctypes.CDLL | bool | None = None


def trim_heap() -> bool:
    """Return free heap pages to the system (glibc); False where the libc has no ``malloc_trim``."""
    global _libc
    if _libc is None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)  # type: ignore[union-attr]
    return True


class IdleTrim:
    """Trims once per burst: :meth:`busy` marks work, :meth:`maybe` (called often) trims after ``idle_s`` quiet."""

    def __init__(self, idle_s: float = 2.0) -> None:
        self.idle_s = idle_s
        self._dirty = False
        self._last_busy = time.monotonic()
        self.trims = 0

    def busy(self) -> None:
        self._dirty = True
        self._last_busy = time.monotonic()

    def maybe(self) -> bool:
        """Trim now if work happened and the process has been idle ``idle_s`` since; True when it trimmed."""
        if not self._dirty or time.monotonic() - self._last_busy < self.idle_s:
            return False
        self._dirty = False
        self.trims += 1
        return trim_heap()


async def trim_while_serving(active: Callable[[], bool], period_s: float = 2.0) -> None:
    """Run until cancelled: every ``period_s`` that finds no request in flight (``active()`` False), trim in a
    thread. Refused requests never count as in flight, so a burst of them is trimmed after as it goes."""
    while True:
        await asyncio.sleep(period_s)
        if not active():
            await asyncio.to_thread(trim_heap)
