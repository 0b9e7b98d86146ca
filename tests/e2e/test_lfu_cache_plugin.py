"""A cache strategy written as a third party would: hash-chained whole blocks, evicted least-frequently-used.

It implements only the strategy half of the API-2 contract (lookup, claim, take, publish, release, clear) and
declares nothing special: it reuses prefixes, its eviction is LFU, and it passes the same conformance suite as the
in-tree strategies, then serves a real generation through the plugin registry.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from frame import LLM, SamplingParams, hookimpl
from frame.interfaces.cache import KVCacheStrategy, PrefixClaim, PrefixMatch
from frame.plugins.registry import PluginRegistry
from frame.testing.cache import CacheConformance, CacheDriver, prompt
from frame.testing.registration import plugin_module, registered


@dataclass
class _Block:
    refs: int = 0
    key: bytes | None = None
    hits: int = 0
    serial: int = 0


@dataclass
class _Published:
    count: int = 0
    keys: list[bytes] = field(default_factory=list)


class LfuCache(KVCacheStrategy):
    """Whole blocks keyed by sha256 of (parent key, tokens, salt); the cached block reused least often goes first."""

    eviction_policy = "lfu"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.blocks = [_Block() for _ in range(num_blocks)]
        self.by_key: dict[bytes, int] = {}
        self.empty = list(range(num_blocks - 1, -1, -1))
        self.cached: list[tuple[int, int, int]] = []  # (hits, serial, block) of unreferenced cached blocks
        self.serial = itertools.count()

    def _keys(self, seq: Any, count: int) -> list[bytes]:
        keys, parent = [], b""
        for i in range(count):
            chunk = seq.token_ids[i * self.block_size:(i + 1) * self.block_size]
            parent = hashlib.sha256(parent + repr((chunk, seq.extra_keys)).encode()).digest()
            keys.append(parent)
        return keys

    def lookup(self, seq: Any) -> PrefixMatch:
        hits = []
        for key in self._keys(seq, (len(seq.token_ids) - 1) // self.block_size):
            if key not in self.by_key:
                break
            hits.append(self.by_key[key])
        return PrefixMatch(len(hits) * self.block_size, hits)

    def plan_claim(self, seq: Any, match: PrefixMatch) -> PrefixClaim:
        hits = self.lookup(seq).handle[:match.num_tokens // self.block_size]
        pinned = sum(1 for b in hits if self.blocks[b].refs == 0)
        return PrefixClaim(len(hits) * self.block_size, tuple(hits), newly_pinned=pinned)

    def claim(self, seq: Any, plan: PrefixClaim) -> _Published:
        for b in plan.shared_blocks:
            self.blocks[b].refs += 1
            self.blocks[b].hits += 1
        return _Published(len(plan.shared_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.empty) + sum(1 for b in self.blocks if b.refs == 0 and b.key is not None)

    def take(self, count: int) -> list[int]:
        taken = []
        while len(taken) < count:
            if self.empty:
                block = self.empty.pop()
            else:
                hits, serial, block = heapq.heappop(self.cached)
                state = self.blocks[block]
                if state.refs or state.key is None or (state.hits, state.serial) != (hits, serial):
                    continue  # a stale heap entry
                del self.by_key[state.key]
                state.key = None
                self.stats.evictions += 1
            self.blocks[block].refs = 1
            taken.append(block)
        return taken

    def publish(self, seq: Any, table: list[int], state: Any, num_tokens: int) -> Any:
        keys = self._keys(seq, num_tokens // self.block_size)
        for i in range(state.count, len(keys)):
            if keys[i] not in self.by_key:
                self.by_key[keys[i]] = table[i]
                self.blocks[table[i]].key = keys[i]
        state.count = max(state.count, len(keys))
        return state

    def release(self, seq: Any, table: list[int], state: Any, num_computed: int) -> None:
        for block in table:
            info = self.blocks[block]
            info.refs -= 1
            if info.refs == 0:
                if info.key is None:
                    self.empty.append(block)
                else:
                    info.serial = next(self.serial)
                    heapq.heappush(self.cached, (info.hits, info.serial, block))

    def clear(self) -> None:
        for block, info in enumerate(self.blocks):
            if info.refs == 0 and info.key is not None:
                del self.by_key[info.key]
                info.key, info.hits = None, 0
                self.empty.append(block)
        self.cached.clear()


@hookimpl
def frame_cache_create(num_blocks: int, block_size: int, options: Any) -> KVCacheStrategy:
    return LfuCache(num_blocks, block_size)


MODULE = plugin_module("frame_cache_lfu", frame_cache_create=frame_cache_create)


class TestLfuConformance(CacheConformance):
    plugin_module = MODULE
    plugin_name = "lfu"

    @pytest.fixture
    def make_cache(self):
        return LfuCache


def test_the_least_frequently_reused_block_is_evicted_first() -> None:
    d = CacheDriver(LfuCache(4, 4))
    popular, rare = prompt(5, start=100), prompt(5, start=200)
    for _ in range(3):  # reused twice
        seq = d.sequence(popular)
        assert d.admit(seq) is not None
        d.finish(seq)
    seq = d.sequence(rare)
    assert d.admit(seq) is not None
    d.finish(seq)  # cached: popular's and rare's first block (the last, partial blocks are not published)
    assert d.admit(d.sequence(prompt(12, start=300))) is not None  # needs 3 blocks: evicts one cached block
    assert d.cache.match(d.sequence(popular)).num_tokens == 4, "the popular block must survive"
    assert d.cache.match(d.sequence(rare)).num_tokens == 0


def test_it_serves_a_generation_through_the_registry() -> None:
    registry = PluginRegistry()
    with registered(registry, "cache", "lfu", MODULE):
        llm = LLM(cache="lfu", dtype="float32", max_model_len=256, registry=registry)
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        prompt_text = "A long shared system prompt for every question: answer briefly. " * 3
        first = llm.generate(prompt_text + "Q1", params)[0]
        second = llm.generate(prompt_text + "Q2", params)[0]
        assert len(first.outputs[0].token_ids) == len(second.outputs[0].token_ids) == 8
        assert llm.stats().prefix_hit_tokens >= 16
