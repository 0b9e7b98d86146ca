"""NoshareCache: a paged KV pool whose sequences share nothing (an author's fill-in of the skeleton)."""

from __future__ import annotations

import heapq
from typing import Any

from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixMatch


class NoshareCache(KVCacheStrategy):
    """Every sequence computes its whole prompt into blocks of its own; a freed block is free again at once.

    The free blocks are a min-heap, so allocations take the lowest ids and a pool stays compact.
    """

    reuses_prefixes = False
    eviction_policy = "none"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._heap = list(range(num_blocks))

    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    @property
    def num_free_blocks(self) -> int:
        return len(self._heap)

    def take(self, count: int) -> list[int]:
        return [heapq.heappop(self._heap) for _ in range(count)]

    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> Any:
        """Nothing to publish: no other sequence will read these blocks."""
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        for block in table:
            heapq.heappush(self._heap, block)

    def clear(self) -> None:
        """Nothing is ever cached."""
