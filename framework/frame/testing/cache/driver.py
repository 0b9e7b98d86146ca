"""CacheDriver: plays scheduler and model runner for a KV-cache strategy and checks it after every call.

It keeps a shadow of the KV pool (which token each written slot holds), so a wrong reuse, a bad copy or a write
into a shared block shows up as a wrong slot the next time a live sequence is checked. ``random_workload`` drives
it through a seeded mix of everything the scheduler does.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from frame.interfaces.cache import Allocation, KVCacheStrategy
from frame.sequence import Sequence

CacheFactory = Callable[[int, int], KVCacheStrategy]
_COUNTERS = ("queries", "query_tokens", "hits", "hit_tokens", "evictions", "peak_blocks_in_use")


def prompt(length: int, start: int = 1000) -> list[int]:
    """``length`` distinct token ids from ``start`` on."""
    return list(range(start, start + length))


class CacheDriver:
    """Plays scheduler and model runner for one strategy, checking the strategy after every call.

    ``kv`` is the shadow pool: for each written ``(block, slot)``, the identity of the token whose KV it holds
    (its whole prefix and the extra keys). ``reserved`` is how many tokens each live sequence has room for.
    """

    def __init__(self, cache: KVCacheStrategy, extra_check: Callable[[KVCacheStrategy, CacheDriver], None]
                 | None = None) -> None:
        self.cache, self.extra_check = cache, extra_check
        self.live: dict[str, Sequence] = {}
        self.reserved: dict[str, int] = {}
        self.kv: dict[tuple[int, int], int] = {}
        self.probes: list[Sequence] = []
        self._ids: dict[object, int] = {}
        self._serial = itertools.count()
        self._counts = self._counters()

    def sequence(self, tokens: list[int], salt: str | None = None) -> Sequence:
        return Sequence(f"seq{next(self._serial)}", list(tokens), cache_salt=salt)

    # -- what the scheduler does -------------------------------------------------------------------------
    def admit(self, seq: Sequence, num_new: int | None = None, compute: bool = True) -> Allocation | None:
        """match + allocate(seq, n, match) for a sequence holding no blocks; then compute and commit the n tokens."""
        match = self.cache.match(seq)
        assert 0 <= match.num_tokens <= len(seq.token_ids) - 1, f"match() covers {match.num_tokens} of {seq.num_tokens}"
        assert self.cache.match(seq).num_tokens == match.num_tokens, "match() is not repeatable"
        remaining = seq.num_tokens - match.num_tokens
        n = remaining if num_new is None else min(num_new, remaining)
        allocation = self._allocate(seq, n, match)
        if allocation is not None:
            assert 0 <= allocation.num_cached_tokens <= match.num_tokens, "claimed more than the match"
            seq.num_computed_tokens += allocation.num_cached_tokens
            self._placed(seq, n, allocation, compute)
        return allocation

    def step(self, seq: Sequence, num_new: int | None = None) -> bool:
        """allocate(seq, n) for a running sequence, compute and commit; False (nothing changed) if it did not fit."""
        n = seq.num_uncomputed_tokens if num_new is None else num_new
        allocation = self._allocate(seq, n, None)
        if allocation is not None:
            assert allocation.num_cached_tokens == 0, "allocate() claimed a match for a running sequence"
            self._placed(seq, n, allocation, True)
        return allocation is not None

    def finish(self, seq: Sequence) -> None:
        self._release(seq)
        self.probes = [*self.probes[-3:], seq]

    def preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.reset_for_recompute()

    def _allocate(self, seq: Sequence, n: int, match: object) -> Allocation | None:
        before = self.snapshot()
        allocation = self.cache.allocate(seq, n, match)  # type: ignore[arg-type]
        if allocation is None:
            assert self.snapshot() == before, "allocate() returned None but changed the cache"
        return allocation

    def _placed(self, seq: Sequence, n: int, allocation: Allocation, compute: bool) -> None:
        table = list(self.cache.block_table(seq.seq_id))
        self.live[seq.seq_id] = seq
        self.reserved[seq.seq_id] = max(self.reserved.get(seq.seq_id, 0), seq.num_computed_tokens + n)
        size = self.cache.block_size
        for copy in allocation.copies:  # the runner performs copies before the step's forward
            assert copy.dst in table and copy.src != copy.dst and 0 < copy.num_tokens <= size, f"bad copy {copy}"
            for slot in range(copy.num_tokens):
                self.kv[(copy.dst, slot)] = self.kv.get((copy.src, slot), -1)
        if compute:
            others = {b for sid in self.live if sid != seq.seq_id for b in self.cache.block_table(sid)}
            ids = self._token_ids(seq)
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + n):
                block = table[pos // size]
                assert block not in others, f"{seq.seq_id} writes position {pos} into shared block {block}"
                self.kv[(block, pos % size)] = ids[pos]
            seq.num_computed_tokens += n
            self.cache.commit(seq)
        self.check()

    def _release(self, seq: Sequence) -> None:
        self.cache.free(seq)
        self.live.pop(seq.seq_id, None)
        self.reserved.pop(seq.seq_id, None)
        assert tuple(self.cache.block_table(seq.seq_id)) == (), "free() left a block table behind"
        self.check()

    # -- checks ---------------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[object, ...]:
        """Everything observable about the cache (probing finished sequences with match(), which is pure)."""
        tables = tuple(sorted((sid, tuple(self.cache.block_table(sid))) for sid in self.live))
        stats = self.cache.stats.as_dict()
        return self.cache.num_free_blocks, tables, stats, tuple(self.cache.match(p).num_tokens for p in self.probes)

    def check(self) -> None:
        cache, size, total = self.cache, self.cache.block_size, self.cache.num_blocks
        owners: dict[int, list[tuple[Sequence, int]]] = {}
        for sid, seq in self.live.items():
            table = list(cache.block_table(sid))
            assert len(table) == cache.num_blocks_needed(self.reserved[sid]), f"{sid}: table {table} has wrong length"
            assert len(set(table)) == len(table) and all(0 <= b < total for b in table), f"{sid}: bad table {table}"
            for index, block in enumerate(table):
                owners.setdefault(block, []).append((seq, index))
        for block, users in owners.items():
            (first, index), *rest = users
            for other, other_index in rest:
                end = (index + 1) * size
                assert other_index == index and first.extra_keys == other.extra_keys, f"block {block} double-owned"
                assert min(first.num_computed_tokens, other.num_computed_tokens) >= end, f"block {block} not full"
                assert first.token_ids[:end] == other.token_ids[:end], f"block {block} shared by different prefixes"
        free = cache.num_free_blocks
        assert 0 <= free <= total - len(owners), f"{free} free blocks but {len(owners)} in live tables"
        assert cache.stats.blocks_in_use == total - free, "stats.blocks_in_use is not num_blocks - num_free_blocks"
        counts = self._counters()
        assert all(a <= b for a, b in zip(self._counts, counts, strict=True)), f"counters went back: {counts}"
        assert cache.stats.hits <= cache.stats.queries and cache.stats.hit_tokens <= cache.stats.query_tokens
        assert cache.stats.peak_blocks_in_use >= cache.stats.blocks_in_use
        self._counts = counts
        for sid, seq in self.live.items():
            table, ids = list(cache.block_table(sid)), self._token_ids(seq)
            for pos in range(seq.num_computed_tokens):
                assert self.kv.get((table[pos // size], pos % size)) == ids[pos], f"{sid}: wrong KV at {pos}"
        if self.extra_check is not None:
            self.extra_check(cache, self)

    def _counters(self) -> tuple[int, ...]:
        return tuple(getattr(self.cache.stats, name) for name in _COUNTERS)

    def _token_ids(self, seq: Sequence) -> list[int]:
        """An id per position that is equal only for equal (extra keys, token prefix)."""
        current = self._ids.setdefault(("root", seq.extra_keys), len(self._ids))
        out = []
        for token in seq.token_ids:
            current = self._ids.setdefault((current, token), len(self._ids))
            out.append(current)
        return out


def check_reset(driver: CacheDriver) -> bool:
    """Call reset(): refused (changing nothing) while a live sequence holds blocks, else everything dropped."""
    busy = any(driver.cache.block_table(sid) for sid in driver.live)
    before = driver.snapshot()
    done = driver.cache.reset()
    assert done is not busy, f"reset() returned {done} with{'' if busy else 'out'} blocks in use"
    if busy:
        assert driver.snapshot() == before, "a refused reset() changed the cache"
    else:
        assert driver.cache.num_free_blocks == driver.cache.num_blocks, "reset() left blocks taken"
        assert all(driver.cache.match(p).num_tokens == 0 for p in driver.probes), "reset() kept cached KV"
    driver.check()
    return done


def random_workload(driver: CacheDriver, seed: int, num_ops: int = 250) -> None:
    """Seeded random admissions, chunked prefills, decodes, preemptions, finishes and resets, then drain."""
    rng, size = random.Random(seed), driver.cache.block_size
    stems = [[rng.randrange(50) for _ in range(rng.randint(1, 3 * size + 2))] for _ in range(3)]
    waiting: list[Sequence] = []
    for _ in range(num_ops):
        running = list(driver.live.values())
        op = rng.random()
        if op < 0.2 and len(waiting) < 4:
            tail = [rng.randrange(50) for _ in range(rng.randint(0, 2 * size + 1))]
            tokens = (rng.choice(stems) + tail) or [7]
            waiting.append(driver.sequence(tokens, rng.choice([None, None, "tenant"])))
        elif op < 0.4 and waiting:
            seq = waiting.pop(rng.randrange(len(waiting)))
            if driver.admit(seq, rng.randint(1, 3 * size)) is None:
                waiting.append(seq)
        elif op < 0.8 and running:
            seq = rng.choice(running)
            if not seq.num_uncomputed_tokens:
                seq.append_token(rng.randrange(50))
            if not driver.step(seq, rng.randint(1, min(seq.num_uncomputed_tokens, 2 * size))):
                driver.preempt(victim := rng.choice(running))
                waiting.append(victim)
        elif op < 0.95 and running:
            driver.finish(rng.choice(running))
        else:
            check_reset(driver)
    for seq in list(driver.live.values()):
        driver.finish(seq)
    assert driver.cache.num_free_blocks == driver.cache.num_blocks, "blocks leaked"
    assert driver.cache.reset() and driver.cache.num_free_blocks == driver.cache.num_blocks
