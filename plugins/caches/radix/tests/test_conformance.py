"""The KV-cache conformance suite, run on radix, with the tree and the pool checked after every call."""

from __future__ import annotations

from collections import Counter

import pytest
from frame.testing.cache import CacheConformance, CacheDriver
from frame_cache_radix import plugin
from frame_cache_radix.strategy import RadixCache


def check_tree(cache: RadixCache, driver: CacheDriver) -> None:
    """Recount every reference from the live tables and the tree, and check the tree's shape."""
    pool, tree, size = cache.pool, cache.tree, cache.block_size
    seq_refs = Counter(b for sid in driver.live for b in cache.block_table(sid))
    node_refs: Counter[int] = Counter()
    pins: Counter[int] = Counter()
    locks: Counter[int] = Counter()
    for state in cache.live_states().values():
        assert (state.node is None) == (state.inserted == 0)
        if state.node is not None:
            assert state.node.alive and state.node.end == state.inserted
        for node in tree.path(state.node):
            locks[id(node)] += 1
    nodes = tree.nodes()
    assert len(nodes) == tree.num_nodes
    for node in nodes:
        parent = node.parent
        assert node.alive and node.tokens and parent is not None and parent.children[node.tokens[0]] is node
        assert node.start == parent.end and node.key == parent.key
        assert len(node.blocks) == (node.end - 1) // size - node.start // size + 1
        assert node.lock_ref == locks[id(node)], "lock counts disagree with the live sequences' paths"
        node_refs.update(node.blocks)
        if node.lock_ref:
            pins.update(node.blocks)
    assert all(root.parent is None and root.children for root in tree.roots.values())
    empty = set(pool.empty_blocks())
    for block in range(cache.num_blocks):
        counts = (pool.seq_refs[block], pool.node_refs[block], pool.pins[block])
        assert counts == (seq_refs[block], node_refs[block], pins[block]), f"block {block}: {counts}"
        assert (block in empty) == (counts == (0, 0, 0)), f"block {block} free and referenced, or lost"
    assert len(empty) == len(pool.empty_blocks())
    assert pool.num_evictable == sum(pool.is_evictable(b) for b in range(cache.num_blocks))


class TestRadixConformance(CacheConformance):
    window_prefix_reuse = True
    plugin_module = plugin
    plugin_name = "radix"

    @pytest.fixture(params=[True, False], ids=["partial", "whole"])
    def make_cache(self, request):
        return lambda num_blocks, block_size: RadixCache(num_blocks, block_size, partial_block_reuse=request.param)

    def check_internals(self, cache, driver) -> None:
        check_tree(cache, driver)
