"""hashchain specifics: the digest, collision safety, LRU eviction order, publishing rules, options."""

from __future__ import annotations

import hashlib

import pydantic
import pytest
from frame.interfaces.cache import PrefixMatch
from frame.testing.cache import CacheDriver, prompt, random_workload
from frame_cache_hashchain.digest import block_digest, make_block_digest
from frame_cache_hashchain.plugin import HashChainOptions, frame_cache_create
from frame_cache_hashchain.strategy import HashChainCache

from .test_conformance import check_pool


def driver(num_blocks: int, block_size: int, **kwargs) -> CacheDriver:
    cache = HashChainCache(num_blocks, block_size, **kwargs)
    return CacheDriver(cache, lambda c, d: check_pool(c, d))  # type: ignore[arg-type]


def run(d: CacheDriver, tokens: list[int], salt: str | None = None):
    seq = d.sequence(tokens, salt)
    assert d.admit(seq) is not None
    return seq


def test_digest_is_a_sha256_chain_over_every_field() -> None:
    base = block_digest(None, [1, 2, 3], ())
    assert len(base) == hashlib.sha256().digest_size and base == block_digest(None, (1, 2, 3), ())
    variants = [
        block_digest(base, [1, 2, 3], ()), block_digest(None, [1, 2, 4], ()), block_digest(None, [1, 2, 3], ("s",)),
        block_digest(None, [1, 2, 3], ("", "")), block_digest(None, [1, 2, 3], ("",)), block_digest(None, [1, 2], ()),
    ]
    assert len({base, *variants}) == 7
    assert len(make_block_digest("sha512")(None, [1], ())) == 64
    with pytest.raises(ValueError, match="unknown hash algorithm"):
        make_block_digest("md5")


def test_a_digest_collision_never_serves_another_prompts_kv() -> None:
    d = driver(12, 4, digest=lambda parent, tokens, keys: b"every block collides")
    first = run(d, prompt(9))
    d.finish(first)  # block 0 published; block 1 collided with it, so the chain stopped there
    cache = d.cache
    assert len(cache.pool.lru_order()) == 1
    same = d.sequence(prompt(9))
    assert cache.match(same).num_tokens == 4  # block 0 is genuine; block 1's lookup finds block 0 and rejects it
    other = d.sequence(prompt(9, start=50))
    assert cache.match(other).num_tokens == 0
    allocation = d.admit(other)
    assert allocation is not None and allocation.num_cached_tokens == 0  # the driver checks every slot's KV
    assert not set(cache.block_table(other.seq_id)) & set(cache.pool.lru_order())
    d.finish(other)
    assert cache.stats.hits == 0 and cache.num_free_blocks == 12


@pytest.mark.parametrize("block_size", [1, 3, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_weak_digest_with_many_collisions_stays_correct(block_size: int, seed: int) -> None:
    def one_byte(parent: bytes | None, tokens, keys) -> bytes:
        return block_digest(parent, tokens, keys)[:1]

    random_workload(driver(12, block_size, digest=one_byte), seed, num_ops=300)


def test_eviction_is_least_recently_released_first_and_a_hit_refreshes() -> None:
    d = driver(6, 4)
    pool = d.cache.pool
    a = run(d, prompt(9, start=100))
    a_blocks = list(d.cache.block_table(a.seq_id))
    d.finish(a)
    b = run(d, prompt(9, start=200))
    b_blocks = list(d.cache.block_table(b.seq_id))
    d.finish(b)
    # Tables are released tail first and only full blocks stay cached: [a1, a0, b1, b0] from oldest.
    assert pool.lru_order() == [a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    again = run(d, prompt(9, start=100))  # a hit takes A's blocks out of the queue ...
    assert d.cache.block_table(again.seq_id)[:2] == tuple(a_blocks[:2])
    d.finish(again)  # ... and releasing them puts them behind B's
    assert pool.lru_order() == [b_blocks[1], b_blocks[0], a_blocks[1], a_blocks[0]]
    evictions = d.cache.stats.evictions
    c = run(d, prompt(16, start=300))  # 2 empty blocks, then 2 evictions: B's, oldest first
    assert list(d.cache.block_table(c.seq_id))[2:] == [b_blocks[1], b_blocks[0]]
    assert d.cache.stats.evictions == evictions + 2
    assert d.cache.match(d.sequence(prompt(9, start=200))).num_tokens == 0
    assert d.cache.match(d.sequence(prompt(9, start=100))).num_tokens == 8
    d.finish(c)


def test_generated_tokens_are_published_once_their_block_is_full() -> None:
    d = driver(8, 4)
    seq = run(d, prompt(5))
    for token in (1, 2, 3):
        seq.append_token(token)
        assert d.step(seq)
    assert d.cache.match(d.sequence([*prompt(5), 1, 2, 3, 9])).num_tokens == 8
    seq.append_token(4)  # sampled but not computed: its block is not full of KV yet
    assert d.cache.match(d.sequence([*prompt(5), 1, 2, 3, 4, 9, 9, 9, 9])).num_tokens == 8
    d.finish(seq)


def test_a_block_computed_twice_is_cached_once() -> None:
    d = driver(10, 4)
    first, second = d.sequence(prompt(9)), d.sequence(prompt(9))
    assert d.admit(first, compute=False) is not None  # admitted before anything was published
    assert d.admit(second) is not None
    assert d.step(first, 9)  # computes its own copy of the two full blocks; the published ones stay
    assert not set(d.cache.block_table(first.seq_id)) & set(d.cache.block_table(second.seq_id))
    d.finish(first)
    d.finish(second)
    assert len(d.cache.pool.lru_order()) == 2 and d.cache.num_free_blocks == 10


def test_a_stale_or_foreign_handle_is_looked_up_again() -> None:
    d = driver(8, 4)
    d.finish(run(d, prompt(9)))
    seq = d.sequence(prompt(9))
    foreign = PrefixMatch(8, handle="not a chain hit")
    allocation = d.cache.allocate(seq, 1, foreign)
    assert allocation is not None and allocation.num_cached_tokens == 8
    late = d.sequence(prompt(9, start=70))
    assert d.cache.allocate(late, 9, PrefixMatch(8, d.cache.match(seq).handle)).num_cached_tokens == 0
    d.cache.free(seq)
    d.cache.free(late)
    assert d.cache.num_free_blocks == 8


def test_options_select_the_hash_algorithm() -> None:
    cache = frame_cache_create(4, 2, HashChainOptions(hash_algorithm="sha512"))
    assert isinstance(cache, HashChainCache) and len(cache.digest(None, [1, 2], ())) == 64
    assert len(frame_cache_create(4, 2, None).digest(None, [1, 2], ())) == 32
    with pytest.raises(pydantic.ValidationError):
        HashChainOptions(hash_algorithm="md5")
    with pytest.raises(pydantic.ValidationError):
        HashChainOptions.model_validate({"eviction": "fifo"})
