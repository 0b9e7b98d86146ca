"""Giving back the resident pages of weights nothing reads any more: a GGUF's blocks stay memory-mapped (the gguf
plugin hands them out without a copy), and where loading joins them into one tensor (a fused QKV) or a platform's
kernel repacks or rewrites them into a copy of its own, the file's pages read while doing so would otherwise stay
resident beside that copy, twice the weight.

Only pages of a read-only file mapping are dropped (``madvise(MADV_DONTNEED)``): they hold nothing but the file's
bytes, and a later read (the reference path's ``dequantize``) brings them back from the page cache. Memory of any
other kind (a tensor's own allocation, a writable mapping) is never touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from frame.interfaces.quantization import PackedWeight


def _file_mapping(start: int, end: int) -> bool:
    """True when ``[start, end)`` lies in one read-only mapping of a file (``/proc/self/maps``)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                low, high = (int(a, 16) for a in fields[0].split("-"))
                if low <= start and end <= high:
                    path = fields[5].strip() if len(fields) > 5 else ""
                    return fields[1][1] == "-" and path.startswith("/")
    except OSError:
        return False
    return False


def madvise(start: int, length: int, advice: int = mmap.MADV_DONTNEED) -> bool:
    """``madvise(2)`` on ``[start, start + length)`` of this process's memory (page-aligned), which Python's
    ``mmap.madvise`` offers only for mappings it made; True when the kernel took the advice."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise(start, length, advice) == 0


def settle_after_load(path: str | Path) -> int:
    """Once a model is loaded and its kernels built: drop this process's resident pages of every read-only mapping
    of the checkpoint at ``path`` (what loading read: metadata, the tokenizer's strings, blocks a kernel copied; a
    later read faults a page back in from the page cache), and give the heap's free memory back to the system
    (``malloc_trim``: copies made and freed while loading, a joined weight before its repacking, would otherwise
    stay resident as free heap). Returns the mapped bytes released; 0 where there is no ``/proc`` or libc."""
    released = 0
    target = str(Path(path).resolve())
    try:
        with open("/proc/self/maps") as maps:
            ranges = [line.split(maxsplit=5) for line in maps]
    except OSError:
        return 0
    for fields in ranges:
        if len(fields) > 5 and fields[5].strip() == target and fields[1][1] == "-":
            low, high = (int(a, 16) for a in fields[0].split("-"))
            released += (high - low) if madvise(low, high - low) else 0
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    return released


def release_file_pages(tensor: torch.Tensor) -> int:
    """Drop this process's resident pages of ``tensor`` when it is a view of a read-only file mapping; the whole
    pages inside it only. Returns the bytes released (0 for any other memory)."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last <= first or not tensor.is_contiguous() or not _file_mapping(start, end):
        return 0
    return last - first if madvise(first, last - first) else 0


def release_weight_pages(packed: PackedWeight, keep: torch.Tensor | None = None) -> int:
    """:func:`release_file_pages` for each tensor of ``packed`` that may view a file (``PackedWeight.file_views``),
    but the one ``keep`` reads in place (a kernel that reads the file's bytes where they lie)."""
    return sum(release_file_pages(t) for t in packed.file_views() if keep is None or t.data_ptr() != keep.data_ptr())
