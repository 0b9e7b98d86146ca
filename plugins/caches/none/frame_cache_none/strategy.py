"""NoCache: a paged block allocator that never reuses KV — the control arm of prefix-caching experiments."""

from __future__ import annotations

from typing import Any

from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixMatch


class NoCache(KVCacheStrategy):
    """Every sequence computes its whole prompt into blocks of its own; freed blocks go straight back to the pool.

    Admissions still count as queries (with zero hits) and usage is tracked, so experiments read the same stats
    from every strategy. Free blocks form a stack, the most recently freed handed out first (their pages are
    mapped and maybe cached; a queue would walk the whole pool's untouched pages first), each sequence's pushed
    in reverse so that the next one gets them in ascending order.
    """

    reuses_prefixes = False
    eviction_policy = "none"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._free: list[int] = list(reversed(range(num_blocks)))  # a stack: block 0 on top

    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int]:
        return [self._free.pop() for _ in range(count)]

    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> Any:
        """Nothing is ever published for reuse."""
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        self._free.extend(reversed(table))

    def clear(self) -> None:
        """Nothing is cached, so there is nothing to drop."""
