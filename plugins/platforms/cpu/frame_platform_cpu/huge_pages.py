"""Packed weights and the KV pool on transparent huge pages.

A decode step streams every weight once, so a small model's step is a read of its weights from memory. Read through
4 KiB pages, such a stream misses the TLB every 4 KiB and walks the page table; Linux backs an anonymous mapping
with 2 MiB pages where the process asks (``madvise(MADV_HUGEPAGE)``, which its default THP mode, ``madvise``,
requires). A SmolLM2 step's one-row bfloat16 linears read their 269 MB at 27.4-28.2 GB/s on 4 KiB pages and at
33.8-33.9 on huge pages (a 2-core Zen 4, three runs; docs/performance-changes.md).

Most of a small model's weights are smaller than a huge page (SmolLM2's QKV is 1.1 MB), so packed weights are
copied back to back into an arena of huge-page chunks (:class:`HugePageArena`); the KV pool, one tensor of
gigabytes allocated but not yet written, is advised in place (:func:`advise`). Where THP is off (``never``) or
missing, neither does anything. Only the cpu platform's own copies move: a weight the platform reads from the
checkpoint's memory map in place stays there.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import mmap
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from frame.weights.pages import madvise

HUGE_PAGE = 2 << 20
#: Weights smaller than this stay where they are: a bias or a norm's scale gains nothing from a huge page.
MIN_BYTES = 64 << 10
_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

_placing: contextvars.ContextVar[bool] = contextvars.ContextVar("frame_cpu_huge_pages", default=False)


@functools.cache
def available() -> bool:
    """True when this kernel backs anonymous memory with transparent huge pages on request (mode ``always`` or
    ``madvise``)."""
    try:
        return "[never]" not in _THP_MODE.read_text()
    except OSError:
        return False


class HugePageArena:
    """Long-lived tensors placed back to back in anonymous private mappings advised as huge pages, ``chunk_bytes``
    each (a tensor larger than that gets a chunk of its own). A chunk's memory is returned when the last tensor in
    it is freed and the arena has moved on to the next chunk."""

    def __init__(self, chunk_bytes: int = 64 << 20) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None  # uint8 view of the current chunk, from its first huge page
        self._used = 0
        self._lock = threading.Lock()

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``tensor`` in the arena, 64-byte aligned."""
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            if self._chunk is None or self._used + nbytes > self._chunk.numel():
                self._chunk, self._used = self._new_chunk(max(self.chunk_bytes, nbytes)), 0
            start = self._used
            self._used = -(-(start + nbytes) // 64) * 64
            out = self._chunk[start:start + nbytes]
        return out.view(tensor.dtype).view(tensor.shape).copy_(tensor)

    @staticmethod
    def _new_chunk(nbytes: int) -> torch.Tensor:
        size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
        # One huge page more than asked, so the chunk can start on a huge-page boundary wherever mmap puts it.
        mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(OSError):  # a kernel without THP: the chunk keeps small pages
            mapping.madvise(mmap.MADV_HUGEPAGE)
        whole = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive as long as any view
        skip = -whole.data_ptr() % HUGE_PAGE
        return whole[skip:skip + size]


_ARENA = HugePageArena()


@contextlib.contextmanager
def placing(enabled: bool = True) -> Iterator[None]:
    """Within this block, :func:`resident` moves what the platform packs into the process's arena (the cpu
    platform opens it around building a layer's kernel, when its ``huge_pages`` option is on)."""
    token = _placing.set(enabled and available())
    try:
        yield
    finally:
        _placing.reset(token)


def resident(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied onto huge pages inside :func:`placing`; itself elsewhere, or when it is small."""
    if not _placing.get() or tensor.device.type != "cpu" or tensor.numel() * tensor.element_size() < MIN_BYTES:
        return tensor
    return _ARENA.place(tensor.contiguous())


def advise(tensor: torch.Tensor) -> bool:
    """Ask for huge pages under ``tensor``'s memory, before it is first written (the pages already touched keep
    their size). True when the kernel took the advice."""
    nbytes = tensor.untyped_storage().nbytes()
    start = tensor.untyped_storage().data_ptr()
    first = -(-start // HUGE_PAGE) * HUGE_PAGE
    last = (start + nbytes) // HUGE_PAGE * HUGE_PAGE
    if not available() or last <= first:
        return False
    return madvise(first, last - first, mmap.MADV_HUGEPAGE)
