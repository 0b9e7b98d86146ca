"""NoCache: a paged block allocator that never reuses KV — the control arm of prefix-caching experiments."""

from __future__ import annotations

from collections import deque
from typing import Any

from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixMatch


class NoCache(KVCacheStrategy):
    """Every sequence computes its whole prompt into blocks of its own; freed blocks go straight back to the pool.

    Admissions still count as queries (with zero hits) and usage is tracked, so experiments read the same stats
    from every strategy. Blocks are handed out from a FIFO free list.
    """

    reuses_prefixes = False
    eviction_policy = "none"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._free: deque[int] = deque(range(num_blocks))

    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int]:
        return [self._free.popleft() for _ in range(count)]

    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> Any:
        """Nothing is ever published for reuse."""
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        self._free.extend(table)

    def clear(self) -> None:
        """Nothing is cached, so there is nothing to drop."""
