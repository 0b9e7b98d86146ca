"""KV groups in the cache contract: a full-attention group beside a sliding one (Gemma 2/3), or one sliding group
(Mistral). Mixed into :class:`~frame.testing.cache.CacheConformance`.

:class:`GroupShadow` plays the model runner for every group: it remembers which token (by its whole prefix)
each written ``(block, slot)`` holds, and checks that every position a live sequence still reads holds its own
token: every computed position in a full group, the last ``window`` ones in a sliding group. So a windowed
prefix hit that hands out a wrong block, or a block given back while still read and then reused, fails where it
happens.
"""

from __future__ import annotations

import pytest

from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.kv_groups import window_blocks
from frame.sequence import Sequence
from frame.testing.cache.driver import CacheFactory, prompt


class GroupShadow:
    """The written KV of every group's blocks, and the checks of what live sequences read."""

    def __init__(self, cache: KVCacheStrategy) -> None:
        self.cache = cache
        self.kv: dict[tuple[int, int], tuple[int, ...]] = {}  # (block, slot) -> the token's whole prefix
        self.live: dict[str, Sequence] = {}

    def step(self, seq: Sequence, num_new: int, match_tokens: int | None = None) -> bool:
        """Allocate (claiming the match on admission; ``num_new`` then counts from the match's end, at most to
        the last token), write the new tokens' KV in every group, commit."""
        cache = self.cache
        if seq.seq_id not in self.live:
            match = cache.match(seq)
            num_new = min(num_new, seq.num_tokens - match.num_tokens)
            allocation = cache.allocate(seq, num_new, match)
            if allocation is None:
                return False
            if match_tokens is not None:
                assert allocation.num_cached_tokens == match_tokens
            for copy in allocation.copies:
                for slot in range(copy.num_tokens):
                    self.kv[(copy.dst, slot)] = self.kv[(copy.src, slot)]
            seq.num_computed_tokens += allocation.num_cached_tokens
            self.live[seq.seq_id] = seq
        elif cache.allocate(seq, num_new) is None:
            return False
        size = cache.block_size
        for g in range(cache.num_groups):
            table = cache.block_table(seq.seq_id, g)
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + num_new):
                self.kv[(table[pos // size], pos % size)] = tuple(seq.token_ids[: pos + 1])
        seq.num_computed_tokens += num_new
        cache.commit(seq)
        self.check()
        return True

    def finish(self, seq: Sequence) -> None:
        self.cache.free(seq)
        self.live.pop(seq.seq_id, None)
        self.check()

    def check(self) -> None:
        """What live sequences read is theirs; groups never share a block; the gauges count the held blocks."""
        cache, size = self.cache, self.cache.block_size
        owners: dict[int, int] = {}
        for g, window in enumerate(cache.windows):
            held: set[int] = set()
            for seq in self.live.values():
                table, blocks = cache.block_table(seq.seq_id, g), cache.held_blocks(seq.seq_id, g)
                held.update(blocks)
                computed = seq.num_computed_tokens
                if window is not None:
                    assert len(blocks) <= window_blocks(window, size) + 1, f"group {g} holds {len(blocks)} blocks"
                for pos in range(0 if window is None else max(computed - window, 0), computed):
                    block = table[pos // size]
                    assert block in blocks, f"group {g}: position {pos} reads block {block}, which it gave back"
                    assert self.kv.get((block, pos % size)) == tuple(seq.token_ids[: pos + 1]), (
                        f"group {g}: position {pos} of {seq.seq_id} reads another token's KV")
            for block in held:
                assert owners.setdefault(block, g) == g, f"block {block} is in groups {owners[block]} and {g}"
            assert cache.stats.group_blocks_in_use[g] == len(held)
        assert cache.stats.blocks_in_use == cache.num_blocks - cache.num_free_blocks


class WindowConformance:
    """KV groups: a windowed group holds only its window, a reused prefix serves every group, nothing leaks.

    ``window_prefix_reuse``: set True when the strategy reuses a windowed group's prefix (it must then reuse a
    finished prompt's whole blocks, whose window is cached, in every group)."""

    window_prefix_reuse: bool = False

    @pytest.fixture(params=[(None, 3), (2,)], ids=["full+window", "window"])
    def windows(self, request: pytest.FixtureRequest) -> tuple[int | None, ...]:
        return request.param

    def grouped(self, make_cache: CacheFactory, block_size: int, windows: tuple[int | None, ...],
                num_blocks: int = 64) -> GroupShadow:
        """A cache over KV groups with ``windows`` given in blocks (so every block size tests the same)."""
        cache = make_cache(num_blocks, block_size)
        cache.set_groups([None if w is None else w * block_size for w in windows])
        return GroupShadow(cache)

    def test_a_windowed_group_holds_only_its_window(self, make_cache: CacheFactory, block_size: int,
                                                    windows: tuple[int | None, ...]) -> None:
        shadow = self.grouped(make_cache, block_size, windows)
        seq = Sequence("long", prompt(12 * block_size + 3))
        while seq.num_computed_tokens < seq.num_tokens:  # a prefill in chunks of one block, then decodes
            assert shadow.step(seq, min(block_size, seq.num_tokens - seq.num_computed_tokens))
        for i in range(2 * block_size):
            seq.append_token(5 + i)
            assert shadow.step(seq, 1)
        cache = shadow.cache
        full = [g for g, w in enumerate(cache.windows) if w is None]
        needed = cache.num_blocks_needed(seq.num_tokens)
        assert [len(cache.held_blocks("long", g)) for g in full] == [needed] * len(full)
        shadow.finish(seq)
        assert cache.num_free_blocks == 64 and cache.stats.group_blocks_in_use == [0] * cache.num_groups
        other = Sequence("other", prompt(3))
        assert shadow.step(other, 3)
        with pytest.raises(RuntimeError):
            cache.set_groups([None])
        shadow.finish(other)
        assert cache.reset()

    def test_a_reused_prefix_serves_every_group(self, make_cache: CacheFactory, block_size: int,
                                                windows: tuple[int | None, ...]) -> None:
        shadow = self.grouped(make_cache, block_size, windows)
        tokens = prompt(10 * block_size + 2)
        first = Sequence("first", tokens)
        while first.num_computed_tokens < first.num_tokens:
            assert shadow.step(first, min(2 * block_size, first.num_tokens - first.num_computed_tokens))
        shadow.finish(first)
        second = Sequence("second", [*tokens, 9])
        matched = shadow.cache.match(second).num_tokens
        assert shadow.step(second, second.num_tokens - matched, match_tokens=matched)
        if self.window_prefix_reuse:
            # The window's blocks are cached (the earlier ones need not be): every full block is reused.
            assert matched >= len(tokens) // block_size * block_size
        shadow.finish(second)
        assert shadow.cache.num_free_blocks == 64

    @pytest.mark.parametrize("seed", [0, 1])
    def test_grouped_workload_reads_only_its_own_kv(self, make_cache: CacheFactory, block_size: int,
                                                    windows: tuple[int | None, ...], seed: int) -> None:
        """Prompts that share prefixes of several lengths, run two at a time over a pool small enough to evict:
        every position a live sequence reads holds its own token, whatever each group reused."""
        import random

        rng = random.Random(seed)
        shadow = self.grouped(make_cache, block_size, windows, num_blocks=12 * len(windows) + 8)
        base = prompt(9 * block_size)
        waiting = [Sequence(f"s{i}", base[: rng.randrange(1, len(base))] + prompt(rng.randrange(1, 3 * block_size),
                                                                                 start=50 * i))
                   for i in range(10)]
        running: list[Sequence] = []
        while waiting or running:
            while waiting and len(running) < 2:
                running.append(waiting.pop(0))
            for seq in list(running):
                num_new = min(rng.randrange(1, 2 * block_size), seq.num_tokens - seq.num_computed_tokens) or 1
                if seq.num_computed_tokens == seq.num_tokens:
                    seq.append_token(rng.randrange(5, 9))
                if not shadow.step(seq, num_new):
                    shadow.finish(seq)  # preempted: recomputed later
                    seq.num_computed_tokens = 0
                    running.remove(seq)
                    waiting.append(seq)
                elif seq.num_tokens > len(base) + 3 * block_size:
                    shadow.finish(seq)
                    running.remove(seq)
        assert shadow.cache.stats.group_blocks_in_use == [0] * len(windows)
        assert shadow.cache.num_free_blocks == shadow.cache.num_blocks
