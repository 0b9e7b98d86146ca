"""NoshareCache: a paged KV pool whose sequences share nothing (an author's fill-in of the skeleton)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence as Seq

from frame.interfaces.cache import Allocation, CacheSequence, KVCacheStrategy, PrefixMatch


class NoshareCache(KVCacheStrategy):
    """Every sequence computes its whole prompt into blocks of its own; a freed block is free again at once.

    The free blocks are a min-heap, so allocations take the lowest ids and a pool stays compact.
    """

    reuses_prefixes = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._heap = list(range(num_blocks))
        self._owned: dict[str, list[int]] = {}

    def match(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    def allocate(self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None = None) -> Allocation | None:
        owned = self._owned.get(seq.seq_id, [])
        missing = max(0, self.num_blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(owned))
        if missing > len(self._heap):
            return None
        if seq.seq_id not in self._owned:
            self.stats.queries += 1
            self.stats.query_tokens += seq.num_prompt_tokens
        self._owned[seq.seq_id] = owned + [heapq.heappop(self._heap) for _ in range(missing)]
        self.track_usage(self.num_blocks - len(self._heap))
        return Allocation()

    def commit(self, seq: CacheSequence) -> None:
        """Nothing to publish: no other sequence will read these blocks."""

    def free(self, seq: CacheSequence) -> None:
        for block in self._owned.pop(seq.seq_id, []):
            heapq.heappush(self._heap, block)
        self.track_usage(self.num_blocks - len(self._heap))

    def block_table(self, seq_id: str) -> Seq[int]:
        return tuple(self._owned.get(seq_id, ()))

    @property
    def num_free_blocks(self) -> int:
        return len(self._heap)

    def reset(self) -> bool:
        return not self._owned  # nothing is ever cached, so only "in use" can refuse
