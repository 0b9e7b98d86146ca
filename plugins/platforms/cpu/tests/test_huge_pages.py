"""Packed weights and the KV pool on transparent huge pages (``huge_pages.py``)."""

from __future__ import annotations

import mmap

import pytest
import torch
from frame_platform_cpu import huge_pages, kernels
from frame_platform_cpu.platform import CpuOptions, CpuPlatform

needs_thp = pytest.mark.skipif(not huge_pages.available(), reason="this kernel offers no transparent huge pages")


def _mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding ``address``."""
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(a, 16) for a in head.split("-"))
                inside = low <= address < high
            elif inside:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    return fields


def test_the_arena_copies_each_tensor_aligned_and_keeps_it_when_it_moves_to_a_new_chunk():
    arena = huge_pages.HugePageArena(chunk_bytes=4 << 20)
    tensors = [torch.randn(n, dtype=torch.float32) for n in (100_000, 300_001, 700_000, 2_000_000)]
    expected = [t.clone() for t in tensors]
    placed = [arena.place(t) for t in tensors]
    del tensors
    for copy in placed:
        assert copy.is_contiguous() and copy.data_ptr() % 64 == 0
    assert placed[0].untyped_storage().data_ptr() % huge_pages.HUGE_PAGE == 0  # a chunk starts on a huge page
    # The fourth (8 MB) did not fit the first 4 MiB chunk: a chunk of its own, the others untouched.
    assert placed[3].untyped_storage().data_ptr() != placed[0].untyped_storage().data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(expected, placed, strict=True))


def test_packing_moves_nothing_outside_the_platforms_placing_block_nor_a_small_tensor():
    weight = torch.randn(256, 512, dtype=torch.bfloat16)
    packed = kernels.pack_weight(weight)
    assert huge_pages.resident(packed) is packed
    with huge_pages.placing(enabled=False):
        assert huge_pages.resident(packed) is packed
    with huge_pages.placing():
        small = torch.ones(16)
        assert huge_pages.resident(small) is small


@needs_thp
def test_a_weight_packed_while_placing_lands_in_a_mapping_linux_may_back_with_huge_pages():
    weight = torch.randn(1024, 1024, dtype=torch.bfloat16)
    with huge_pages.placing():
        packed = kernels.pack_weight(weight)
    assert torch.equal(packed, kernels.pack_weight(weight))
    assert _mapping_of(packed.data_ptr()).get("THPeligible") == "1"


@needs_thp
def test_the_cpu_platform_advises_the_kv_pool_unless_told_not_to():
    # A mapping of its own: a torch allocation may reuse memory an earlier test advised.
    mapping = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pool = torch.frombuffer(mapping, dtype=torch.uint8)
    middle = pool.data_ptr() + (8 << 20)
    CpuPlatform(CpuOptions(huge_pages=False)).place_kv_pool(pool)
    if "[madvise]" in huge_pages._THP_MODE.read_text():
        assert _mapping_of(middle).get("THPeligible") == "0"
    CpuPlatform().place_kv_pool(pool)
    assert _mapping_of(middle).get("THPeligible") == "1"

def test_describe_says_whether_the_weights_and_pool_are_on_huge_pages():
    assert ("huge pages" in CpuPlatform().describe()) == huge_pages.available()
    assert "huge pages" not in CpuPlatform(CpuOptions(huge_pages=False)).describe()
