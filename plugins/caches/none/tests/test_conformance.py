"""The KV-cache conformance suite, run on none (no reuse), plus what sets it apart."""

from __future__ import annotations

from collections import Counter

import pytest
from frame.testing.cache import CacheConformance, CacheDriver, prompt
from frame_cache_none import plugin
from frame_cache_none.strategy import NoCache


class TestNoCacheConformance(CacheConformance):
    plugin_module = plugin
    plugin_name = "none"

    @pytest.fixture
    def make_cache(self):
        return NoCache

    def check_internals(self, cache, driver) -> None:
        held = Counter(b for sid in driver.live for b in cache.block_table(sid))
        assert all(count == 1 for count in held.values()), "a block is in two tables"
        assert cache.num_free_blocks + sum(held.values()) == cache.num_blocks


def test_identical_prompts_never_share_and_still_count_queries() -> None:
    d = CacheDriver(NoCache(12, 4))
    first = d.sequence(prompt(9))
    assert d.admit(first) is not None
    second = d.sequence(prompt(9))
    allocation = d.admit(second)
    assert allocation is not None and allocation.num_cached_tokens == 0
    assert not set(d.cache.block_table(first.seq_id)) & set(d.cache.block_table(second.seq_id))
    assert d.cache.num_free_blocks == 12 - 6
    stats = d.cache.stats
    assert (stats.queries, stats.query_tokens, stats.hits, stats.hit_tokens) == (2, 18, 0, 0)
    assert (stats.blocks_in_use, stats.peak_blocks_in_use) == (6, 6)
    d.finish(first)
    d.finish(second)
    assert d.cache.num_free_blocks == 12 and d.cache.stats.peak_blocks_in_use == 6
