"""NoCache: a paged block allocator that never reuses KV — the control arm of prefix-caching experiments."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq

from frame.interfaces.cache import Allocation, CacheSequence, KVCacheStrategy, PrefixMatch


class NoCache(KVCacheStrategy):
    """Every sequence computes its whole prompt into blocks of its own; freed blocks go straight back to the pool.

    Lookups still count as queries (with zero hits) and usage is tracked, so experiments read the same stats
    from every strategy. Allocation and release are O(blocks) with a FIFO free list.
    """

    reuses_prefixes = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[str, list[int]] = {}

    def match(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    def allocate(
        self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None = None
    ) -> Allocation | None:
        table = self._tables.get(seq.seq_id)
        held = len(table) if table is not None else 0
        missing = self.num_blocks_needed(seq.num_computed_tokens + num_new_tokens) - held
        if missing > len(self._free):
            return None
        if table is None:
            table = self._tables[seq.seq_id] = []
            self.stats.queries += 1
            self.stats.query_tokens += len(seq.token_ids)
        table.extend(self._free.popleft() for _ in range(max(missing, 0)))
        self._track()
        return Allocation()

    def commit(self, seq: CacheSequence) -> None:
        """Nothing is ever published for reuse, so a committed step changes no state."""

    def free(self, seq: CacheSequence) -> None:
        table = self._tables.pop(seq.seq_id, None)
        if table is not None:
            self._free.extend(table)
            self._track()

    def block_table(self, seq_id: str) -> Seq[int]:
        return tuple(self._tables.get(seq_id, ()))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def reset(self) -> bool:
        # Nothing is cached, so an idle pool is already reset; a busy one is refused like every strategy's.
        return len(self._free) == self.num_blocks

    def _track(self) -> None:
        self.track_usage(self.num_blocks - len(self._free))
