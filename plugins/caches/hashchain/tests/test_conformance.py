"""The KV-cache conformance suite, run on hashchain, with its private state checked after every call."""

from __future__ import annotations

from collections import Counter

import pytest
from frame.testing.cache import CacheConformance, CacheDriver
from frame_cache_hashchain import plugin
from frame_cache_hashchain.strategy import HashChainCache


def check_pool(cache: HashChainCache, driver: CacheDriver) -> None:
    """Reference counts equal the live tables; every unreferenced block is empty or cached, never both."""
    pool = cache.pool
    refs = Counter(b for sid in driver.live for b in cache.block_table(sid))
    cached = set(pool.lru_order())
    for block in pool.blocks:
        assert block.ref_count == refs[block.block_id], f"block {block.block_id}: ref {block.ref_count}"
        if block.ref_count == 0:
            assert (block.block_id in cached) == (block.digest is not None) == (not pool.is_empty(block.block_id))
        else:
            assert block.block_id not in cached
        if block.digest is not None:
            assert pool.lookup(block.digest) is block
    assert pool.num_referenced == len(refs)
    assert pool.num_free == cache.num_blocks - len(refs)


class TestHashChainConformance(CacheConformance):
    window_prefix_reuse = True
    plugin_module = plugin
    plugin_name = "hashchain"

    @pytest.fixture
    def make_cache(self):
        return HashChainCache

    def check_internals(self, cache, driver) -> None:
        check_pool(cache, driver)
