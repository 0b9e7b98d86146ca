"""CacheConformance: the KV-cache contract as a pytest base class (see :mod:`frame.testing.cache`)."""

from __future__ import annotations

from types import ModuleType

import pytest

from frame.interfaces.cache import KVCacheStrategy
from frame.sequence import Sequence
from frame.testing.cache.driver import CacheDriver, CacheFactory, check_reset, prompt, random_workload
from frame.testing.cache.windows import WindowConformance


class CacheConformance(WindowConformance):
    """The contract of :class:`~frame.interfaces.cache.KVCacheStrategy`, run against the ``make_cache`` fixture.

    Every test runs for block sizes 1, 4 and 16 (override the ``block_size`` fixture to change that). What the
    strategy reuses is read from its own ``reuses_prefixes``: a strategy that says it reuses prefixes must reuse
    every whole cached block it still holds; one that says it does not must never match anything. Eviction order
    is the strategy's own (LRU, LFU, ...); the suite only checks that eviction is correct and makes room.
    """

    #: The plugin's module and name; when set, the suite also registers it and creates it through its hooks.
    plugin_module: ModuleType | None = None
    plugin_name: str = ""

    @pytest.fixture
    def make_cache(self) -> CacheFactory:
        pytest.fail(f"{type(self).__name__} must define a make_cache fixture: (num_blocks, block_size) -> strategy")

    @pytest.fixture(params=[1, 4, 16], ids=lambda size: f"bs{size}")
    def block_size(self, request: pytest.FixtureRequest) -> int:
        return request.param

    def check_internals(self, cache: KVCacheStrategy, driver: CacheDriver) -> None:
        """Called after every driver call; override to compare private state with ``driver.live``."""

    def driver(self, make_cache: CacheFactory, block_size: int, num_blocks: int = 16) -> CacheDriver:
        return CacheDriver(make_cache(num_blocks, block_size), self.check_internals)

    def run(self, d: CacheDriver, tokens: list[int], salt: str | None = None, decode: int = 0) -> Sequence:
        """Admit a sequence, prefill it, decode ``decode`` tokens; returns it still running."""
        seq = d.sequence(tokens, salt)
        assert d.admit(seq) is not None
        for i in range(decode):
            seq.append_token(7 + i)
            assert d.step(seq)
        return seq

    # -- the empty pool ----------------------------------------------------------------------------------
    def test_a_fresh_pool_is_empty(self, make_cache: CacheFactory, block_size: int) -> None:
        cache = make_cache(8, block_size)
        assert (cache.num_blocks, cache.block_size, cache.num_free_blocks) == (8, block_size, 8)
        assert tuple(cache.block_table("nobody")) == ()
        assert (cache.stats.queries, cache.stats.hits, cache.stats.evictions, cache.stats.blocks_in_use) == (0,) * 4
        assert cache.match(Sequence("a", prompt(3 * block_size + 1))).num_tokens == 0
        assert cache.match(Sequence("b", [5])).num_tokens == 0
        assert cache.reset() and cache.num_free_blocks == 8

    def test_match_has_no_side_effects(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        d.finish(self.run(d, prompt(2 * block_size + 3), decode=2))
        other = self.run(d, prompt(block_size + 1, start=5))
        probe = d.sequence(prompt(2 * block_size + 3))
        before = d.snapshot()
        first, second = d.cache.match(probe), d.cache.match(probe)
        assert first.num_tokens == second.num_tokens and d.snapshot() == before
        d.finish(other)

    # -- allocation ----------------------------------------------------------------------------------------
    def test_block_tables_grow_with_allocations(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        seq = d.sequence(prompt(4 * block_size + 2))
        assert d.admit(seq, 1) is not None
        for chunk in (block_size, 2, 1, block_size + 1, 10 * block_size):
            assert d.step(seq, min(chunk, seq.num_uncomputed_tokens))
            assert len(d.cache.block_table(seq.seq_id)) == d.cache.num_blocks_needed(seq.num_computed_tokens)
            assert d.cache.num_free_blocks == 16 - len(d.cache.block_table(seq.seq_id))
        assert d.cache.allocate(seq, 0) is not None
        assert d.cache.num_free_blocks == 16 - d.cache.num_blocks_needed(seq.num_tokens)
        d.finish(seq)

    def test_allocate_until_full_returns_none_without_side_effects(self, make_cache: CacheFactory,
                                                                    block_size: int) -> None:
        d = self.driver(make_cache, block_size, num_blocks=8)
        admitted = []
        for i in range(6):
            seq = d.sequence(prompt(2 * block_size, start=1000 * (i + 1)))
            if d.admit(seq) is None:  # the driver checks that a refusal changed nothing
                break
            admitted.append(seq)
        assert len(admitted) == 4 and d.cache.num_free_blocks == 0
        admitted[0].append_token(3)
        assert not d.step(admitted[0]) and not d.step(admitted[1], block_size + 1)
        for seq in admitted:
            d.finish(seq)
        assert d.cache.num_free_blocks == 8

    def test_a_prompt_larger_than_the_pool_is_refused(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size, num_blocks=4)
        cached = self.run(d, prompt(2 * block_size + 1))
        d.finish(cached)
        too_long = d.sequence(cached.token_ids + prompt(3 * block_size, start=9))
        assert d.admit(too_long) is None and tuple(d.cache.block_table(too_long.seq_id)) == ()
        assert d.admit(d.sequence(prompt(4 * block_size + 1, start=50))) is None

    def test_free_is_idempotent_and_unknown_sequences_are_harmless(self, make_cache: CacheFactory,
                                                                    block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        seq = self.run(d, prompt(3 * block_size))
        stranger = Sequence("stranger", prompt(block_size + 2))
        stranger.num_computed_tokens = block_size + 1
        before = d.snapshot()
        d.cache.free(stranger)
        d.cache.commit(stranger)
        assert d.snapshot() == before
        d.finish(seq)
        after = d.snapshot()
        d.cache.free(seq)
        assert d.snapshot() == after and d.cache.num_free_blocks == 16

    def test_a_match_is_claimed_only_on_admission(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        d.finish(self.run(d, prompt(3 * block_size + 1)))
        seq = d.sequence(prompt(3 * block_size + 1))
        assert d.admit(seq, 1) is not None
        table = tuple(d.cache.block_table(seq.seq_id))
        allocation = d.cache.allocate(seq, 0, d.cache.match(seq))
        assert allocation is not None and allocation.num_cached_tokens == 0 and not allocation.copies
        assert tuple(d.cache.block_table(seq.seq_id)) == table
        d.finish(seq)

    # -- release, reset, leaks -----------------------------------------------------------------------------
    def test_everything_freed_leaks_nothing(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size, num_blocks=24)
        stem = prompt(2 * block_size + 1)
        seqs = [self.run(d, stem + prompt(i, start=100 * i), salt=None if i % 2 else "x", decode=i % 3)
                for i in range(4)]
        d.preempt(seqs[1])
        assert d.admit(seqs[1]) is not None
        for seq in seqs:
            d.finish(seq)
        assert d.cache.num_free_blocks == 24 and d.cache.stats.blocks_in_use == 0
        assert check_reset(d) and d.cache.num_free_blocks == 24

    def test_reset_is_refused_while_in_use_and_clears_when_idle(self, make_cache: CacheFactory,
                                                               block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        d.finish(self.run(d, prompt(2 * block_size + 2)))
        running = self.run(d, prompt(block_size + 1, start=7))
        assert not check_reset(d)
        d.finish(running)
        assert check_reset(d)
        assert d.cache.match(d.sequence(prompt(2 * block_size + 2))).num_tokens == 0

    # -- reuse -----------------------------------------------------------------------------------------------
    def test_a_cached_prefix_is_reused(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        tokens = prompt(3 * block_size + 2)
        first = self.run(d, tokens, decode=2)
        first_table = tuple(d.cache.block_table(first.seq_id))
        d.finish(first)
        second = d.sequence(tokens)
        matched = d.cache.match(second).num_tokens
        if not d.cache.reuses_prefixes:
            assert matched == 0
        else:
            assert (len(tokens) - 1) // block_size * block_size <= matched <= len(tokens) - 1
        allocation = d.admit(second)
        assert allocation is not None and allocation.num_cached_tokens == matched
        full = matched // block_size
        assert tuple(d.cache.block_table(second.seq_id))[:full] == first_table[:full]
        assert (d.cache.stats.hits, d.cache.stats.hit_tokens) == ((1, matched) if matched else (0, 0))
        assert (d.cache.stats.queries, d.cache.stats.query_tokens) == (2, 2 * len(tokens))
        d.finish(second)

    def test_running_sequences_share_a_committed_prefix(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        tokens = prompt(3 * block_size + 2)
        first = self.run(d, tokens)
        second = d.sequence(tokens)
        allocation = d.admit(second)
        assert allocation is not None
        least = (len(tokens) - 1) // block_size * block_size if d.cache.reuses_prefixes else 0
        assert least <= allocation.num_cached_tokens <= (len(tokens) - 1 if d.cache.reuses_prefixes else 0)
        d.finish(first)
        d.finish(second)
        assert d.cache.num_free_blocks == 16

    def test_extra_keys_isolate_tenants(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        tokens = prompt(2 * block_size + 2)
        d.finish(self.run(d, tokens, salt="alice"))
        for salt in ("bob", None):
            seq = d.sequence(tokens, salt)
            assert d.cache.match(seq).num_tokens == 0
            allocation = d.admit(seq)
            assert allocation is not None and allocation.num_cached_tokens == 0 and not allocation.copies
            d.finish(seq)
        same = d.cache.match(d.sequence(tokens, "alice")).num_tokens
        assert (same >= 2 * block_size) if d.cache.reuses_prefixes else same == 0

    def test_match_never_covers_every_token(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size, num_blocks=24)
        done = self.run(d, prompt(2 * block_size + 1), decode=3)
        d.finish(done)
        computed = done.num_computed_tokens
        for k in range(1, done.num_tokens + 3):
            tokens = ([*done.token_ids, 99999, 99998])[:k]
            matched = d.cache.match(d.sequence(tokens)).num_tokens
            assert 0 <= matched <= k - 1
            if d.cache.reuses_prefixes and k <= computed:
                assert matched >= (k - 1) // block_size * block_size

    # -- eviction ------------------------------------------------------------------------------------------
    def test_no_eviction_while_empty_blocks_remain(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        d.finish(self.run(d, prompt(2 * block_size + 1)))
        probe = d.sequence(prompt(2 * block_size + 1))
        matched, evictions = d.cache.match(probe).num_tokens, d.cache.stats.evictions
        d.finish(self.run(d, prompt(3 * block_size, start=5)))
        assert d.cache.stats.evictions == evictions and d.cache.match(probe).num_tokens == matched

    def test_eviction_makes_room_up_to_capacity(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size, num_blocks=8)
        d.finish(self.run(d, prompt(2 * block_size + 1)))
        probe = d.sequence(prompt(2 * block_size + 1))
        had = d.cache.match(probe).num_tokens
        big = self.run(d, prompt(8 * block_size, start=5))
        assert d.cache.num_free_blocks == 0 and d.cache.match(probe).num_tokens == 0
        assert d.cache.stats.evictions >= (1 if had else 0)
        d.finish(big)
        assert d.admit(d.sequence(prompt(8 * block_size + 1, start=7))) is None
        assert check_reset(d)

    # -- preemption, stats, stress, hooks --------------------------------------------------------------------
    def test_a_preempted_sequence_is_recomputed_correctly(self, make_cache: CacheFactory, block_size: int) -> None:
        d = self.driver(make_cache, block_size)
        seq = d.sequence(prompt(4 * block_size + 3))
        assert d.admit(seq, block_size + 1) is not None and d.step(seq, block_size)
        computed = seq.num_computed_tokens
        d.preempt(seq)
        allocation = d.admit(seq)
        assert allocation is not None
        least = computed // block_size * block_size if d.cache.reuses_prefixes else 0
        assert allocation.num_cached_tokens >= least
        d.finish(seq)
        assert d.cache.num_free_blocks == 16

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_random_workload(self, make_cache: CacheFactory, block_size: int, seed: int) -> None:
        random_workload(self.driver(make_cache, block_size, num_blocks=12), seed)

    def test_created_through_the_plugin_hooks(self, block_size: int) -> None:
        if self.plugin_module is None:
            pytest.skip("set plugin_module and plugin_name to check registration and the create hook")
        from frame.testing.registration import plugin_hooks

        with plugin_hooks("cache", self.plugin_name, self.plugin_module) as (hooks, defaults):
            for options in ((defaults,) if defaults else ()) + (None,):
                cache = hooks.create_cache(self.plugin_name, 8, block_size, options)
                assert isinstance(cache, KVCacheStrategy) and (cache.num_blocks, cache.block_size) == (8, block_size)
                assert cache.num_free_blocks == 8
