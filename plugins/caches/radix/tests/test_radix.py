"""radix specifics: mid-block reuse with exact counts, tree shape, LRU over leaves, options, long stress."""

from __future__ import annotations

import pytest
from frame.interfaces.cache import BlockCopy
from frame.plugins.registry import PluginRegistry
from frame.testing.cache import CacheDriver, prompt, random_workload
from frame_cache_radix.plugin import RadixOptions, frame_cache_create
from frame_cache_radix.strategy import RadixCache

from .test_conformance import check_tree


def driver(num_blocks: int, block_size: int, partial: bool = True, cache=None) -> CacheDriver:
    cache = cache or RadixCache(num_blocks, block_size, partial_block_reuse=partial)
    check = (lambda c, d: check_tree(c, d)) if isinstance(cache, RadixCache) else None
    return CacheDriver(cache, check)


def forty_then_thirty_seven(d: CacheDriver):
    """The brief's case: 40 tokens computed and freed, then 45 tokens whose first 37 are the same."""
    first = d.sequence(prompt(40))
    assert d.admit(first) is not None
    table = list(d.cache.block_table(first.seq_id))
    d.finish(first)
    second = d.sequence(prompt(37) + prompt(8, start=5000))
    return table, second, d.admit(second)


def test_a_match_inside_a_block_is_reused_by_copying_its_slots() -> None:
    d = driver(10, 16)
    (a0, a1, a2), second, allocation = forty_then_thirty_seven(d)
    table = d.cache.block_table(second.seq_id)
    assert allocation.num_cached_tokens == 37 and second.num_computed_tokens == 45
    assert len(table) == 3 and tuple(table[:2]) == (a0, a1) and table[2] not in (a0, a1, a2)
    assert allocation.copies == (BlockCopy(src=a2, dst=table[2], num_tokens=5),)
    # In use: a0 and a1 (shared), a2 (pinned as the copy's source on the locked path), the new block.
    assert d.cache.num_free_blocks == 6 and d.cache.stats.blocks_in_use == 4
    assert (d.cache.stats.hits, d.cache.stats.hit_tokens, d.cache.stats.query_tokens) == (1, 37, 85)
    d.finish(second)
    assert d.cache.num_free_blocks == 10


def test_hashchain_reuses_only_the_whole_blocks_of_the_same_case() -> None:
    registry = PluginRegistry()
    if "hashchain" not in registry.names("cache"):
        pytest.skip("frame-cache-hashchain is not installed")
    hashchain = registry.load("cache", "hashchain").frame_cache_create(10, 16, None)
    _, _, allocation = forty_then_thirty_seven(driver(10, 16, cache=hashchain))
    assert allocation.num_cached_tokens == 32 and allocation.copies == ()


def test_whole_block_mode_rounds_a_match_down() -> None:
    d = driver(10, 16, partial=False)
    (a0, a1, _), second, allocation = forty_then_thirty_seven(d)
    assert allocation.num_cached_tokens == 32 and allocation.copies == ()
    assert tuple(d.cache.block_table(second.seq_id)[:2]) == (a0, a1)
    d.finish(second)


def test_a_split_inside_a_block_shares_that_block_between_parent_and_child() -> None:
    d = driver(10, 16)
    (a0, a1, a2), second, _ = forty_then_thirty_seven(d)
    b2 = d.cache.block_table(second.seq_id)[2]
    d.finish(second)
    tree, pool = d.cache.tree, d.cache.pool
    (head,) = tree.roots[()].children.values()
    assert (head.start, head.end, head.blocks) == (0, 37, [a0, a1, a2])
    tails = sorted((n.start, n.end, n.blocks) for n in head.children.values())
    assert tails == [(37, 40, [a2]), (37, 45, [b2])]
    assert pool.node_refs[a2] == 2 and d.cache.num_free_blocks == 10
    # A third prompt following the second's branch reuses 45 tokens: 2 shared blocks, 13 slots copied from b2.
    third = d.sequence([*second.token_ids, 1, 2, 3])
    allocation = d.admit(third)
    assert allocation.num_cached_tokens == 45
    assert allocation.copies == (BlockCopy(src=b2, dst=d.cache.block_table(third.seq_id)[2], num_tokens=13),)
    d.finish(third)


def test_a_match_on_a_block_boundary_needs_no_copy() -> None:
    d = driver(8, 4)
    first = d.sequence(prompt(8))
    assert d.admit(first) is not None
    d.finish(first)
    allocation = d.admit(d.sequence([*prompt(8), 1, 2]))
    assert allocation.num_cached_tokens == 8 and allocation.copies == ()


def test_one_sequence_stays_one_node_as_it_grows() -> None:
    d = driver(16, 4)
    seq = d.sequence(prompt(6))
    assert d.admit(seq) is not None
    for token in range(13):
        seq.append_token(token)
        assert d.step(seq)
    assert d.cache.tree.num_nodes == 1
    d.finish(seq)
    (node,) = d.cache.tree.nodes()
    assert (node.end, node.lock_ref) == (19, 0)  # everything computed, including the partial last block


def test_eviction_frees_least_recently_used_leaves_first() -> None:
    d = driver(6, 4)
    runs = {}
    for start in (100, 200):
        seq = d.sequence(prompt(6, start=start))
        assert d.admit(seq) is not None
        runs[start] = tuple(d.cache.block_table(seq.seq_id))
        d.finish(seq)
    touch = d.sequence(prompt(6, start=100))
    assert d.admit(touch, 1) is not None  # 100's path is now the most recently used
    d.finish(touch)
    big = d.sequence(prompt(12, start=300))  # 3 blocks: the 2 empty ones, then 200's leaf is evicted (2 blocks)
    assert d.admit(big) is not None
    assert d.cache.stats.evictions == 2 and not set(d.cache.block_table(big.seq_id)) & set(runs[100])
    assert d.cache.match(d.sequence(prompt(6, start=100))).num_tokens == 5
    assert d.cache.match(d.sequence(prompt(6, start=200))).num_tokens == 0
    d.finish(big)


def test_evicting_children_then_their_parent_and_dropping_empty_roots() -> None:
    d = driver(8, 2)
    for tail in ([1, 2, 3], [4, 5, 6]):
        seq = d.sequence(prompt(3) + tail, salt="tenant")
        assert d.admit(seq) is not None
        d.finish(seq)
    assert d.cache.tree.num_nodes == 3 and d.cache.num_free_blocks == 8
    big = d.sequence(prompt(16, start=50))
    assert d.admit(big, compute=False) is not None  # needs every block: both leaves, then their parent
    assert d.cache.tree.num_nodes == 0 and d.cache.tree.roots == {}
    d.finish(big)


def test_a_running_sequence_keeps_its_matched_path() -> None:
    d = driver(6, 4)
    first = d.sequence(prompt(8))
    assert d.admit(first) is not None
    d.finish(first)
    keeper = d.sequence(prompt(7))
    assert d.admit(keeper).num_cached_tokens == 6
    assert d.admit(d.sequence(prompt(17, start=90))) is None  # would need the locked path's blocks
    assert d.cache.match(d.sequence(prompt(8))).num_tokens == 7
    d.finish(keeper)


def test_options_and_the_create_hook() -> None:
    assert frame_cache_create(4, 2, RadixOptions(partial_block_reuse=False)).partial_block_reuse is False
    assert frame_cache_create(4, 2, None).partial_block_reuse is True


@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("seed", [10, 11])
def test_long_random_workload(block_size: int, seed: int) -> None:
    random_workload(driver(20, block_size), seed, num_ops=800)


def test_the_eviction_heap_stays_bounded_without_evictions() -> None:
    d = driver(64, 4)
    for i in range(300):
        seq = d.sequence(prompt(6 + i % 5))
        assert d.admit(seq) is not None
        d.finish(seq)
    tree = d.cache.tree
    assert d.cache.stats.evictions == 0 and len(tree._heap) <= 2 * tree.num_nodes + 65
