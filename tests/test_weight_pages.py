"""frame.weights.pages: a memory-mapped file's pages under a tensor are given back; any other memory never is."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from frame.weights.pages import release_file_pages


def resident_kib(path: Path) -> int:
    """This process's resident KiB of its mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0] and not line.endswith(":"):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_a_file_mappings_pages_are_given_back_and_read_again(tmp_path: Path) -> None:
    path = tmp_path / "blocks.bin"
    data = np.random.default_rng(0).integers(0, 256, 4 << 20, dtype=np.uint8)
    data.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tensor = torch.from_numpy(mapped[4096:])
    assert int(tensor.sum()) == int(data[4096:].sum())  # every page read: resident
    assert resident_kib(path) >= 4000
    released = release_file_pages(tensor)
    assert released >= (4 << 20) - 2 * 4096
    assert resident_kib(path) <= 8
    assert torch.equal(tensor, torch.from_numpy(data[4096:]))  # read again from the file, unchanged


def test_memory_of_its_own_is_never_dropped() -> None:
    tensor = torch.arange(1 << 20, dtype=torch.int32)
    assert release_file_pages(tensor) == 0
    assert torch.equal(tensor, torch.arange(1 << 20, dtype=torch.int32))
