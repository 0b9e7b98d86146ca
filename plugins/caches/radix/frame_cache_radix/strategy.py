"""RadixCache: SGLang-style token-granular prefix caching over a paged pool."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

from frame.interfaces.cache import Allocation, BlockCopy, CacheSequence, KVCacheStrategy, PrefixMatch

from frame_cache_radix.pool import RefPool
from frame_cache_radix.tree import Node, RadixTree


@dataclass
class _SeqState:
    """A live sequence: its block table and its place in the tree.

    ``node`` is the deepest node of the sequence's locked path and covers ``tokens[:inserted]``
    (``node.end == inserted``; None when nothing is inserted yet).
    """

    table: list[int]
    node: Node | None = None
    inserted: int = 0


class RadixCache(KVCacheStrategy):
    """Prefix reuse at token granularity: full blocks are shared by reference, a partly matched block is copied.

    A match may end inside a block that the tree owns. The sequence cannot share that block, because it will
    write its own next tokens into the block's remaining slots (which hold another branch's KV), so it gets a
    fresh block and a :class:`BlockCopy` of the matched slots; every full block before it is shared.

    Sequences enter the tree at :meth:`commit` (their full blocks) and at :meth:`free` (everything computed,
    including a partial last block, which the tree then owns). The tree only ever holds blocks that no sequence
    will write again. A live sequence locks its path; eviction frees unlocked leaves, least recently used first.
    """

    def __init__(self, num_blocks: int, block_size: int, partial_block_reuse: bool = True) -> None:
        super().__init__(num_blocks, block_size)
        self.partial_block_reuse = partial_block_reuse
        self.pool = RefPool(num_blocks)
        self.tree = RadixTree(self.pool, block_size)
        self._seqs: dict[str, _SeqState] = {}

    # -- lookups ----------------------------------------------------------------------------------------
    def match(self, seq: CacheSequence) -> PrefixMatch:
        num_tokens, node = self._lookup(seq, len(seq.token_ids) - 1)
        return PrefixMatch(num_tokens, node)

    def _lookup(self, seq: CacheSequence, limit: int) -> tuple[int, Node | None]:
        if limit <= 0:
            return 0, None
        num_tokens, node = self.tree.match(seq.extra_keys, seq.token_ids, limit)
        if not self.partial_block_reuse:
            num_tokens -= num_tokens % self.block_size
            while node is not None and node.start >= num_tokens:
                node = node.parent if node.parent is not None and node.parent.parent is not None else None
        return num_tokens, node if num_tokens else None

    def block_table(self, seq_id: str) -> Seq[int]:
        state = self._seqs.get(seq_id)
        return tuple(state.table) if state else ()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    # -- allocation -------------------------------------------------------------------------------------
    def allocate(
        self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None = None
    ) -> Allocation | None:
        state = self._seqs.get(seq.seq_id)
        if state is not None:
            missing = self.num_blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(state.table)
            if missing > self.pool.num_free:
                return None
            if missing > 0:
                state.table.extend(self._take(missing))
            return Allocation()
        return self._admit(seq, num_new_tokens, match)

    def _admit(self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None) -> Allocation | None:
        size = self.block_size
        cached, node = 0, None
        if match is not None and match.num_tokens > 0 and not seq.num_computed_tokens:
            # Look again: the tree may have changed since match(); never claim more than the caller planned for.
            cached, node = self._lookup(seq, min(match.num_tokens, len(seq.token_ids) - 1))
        owners, referenced = self.tree.path_blocks(node, cached)
        num_shared = cached // size
        missing = self.num_blocks_needed(seq.num_computed_tokens + cached + num_new_tokens) - num_shared
        # Locking the matched path pins its blocks; those that were evictable stop counting as free.
        newly_pinned = sum(1 for block in referenced if self.pool.is_evictable(block))
        if missing + newly_pinned > self.pool.num_free:
            return None
        if node is not None and node.end > cached:
            node = self.tree.split(node, cached - node.start)
        self.tree.lock(node)
        for block in owners[:num_shared]:
            self.pool.adjust(block, seq=1)
        table = owners[:num_shared] + self._take(missing)
        copies: tuple[BlockCopy, ...] = ()
        if cached % size:
            copies = (BlockCopy(src=owners[num_shared], dst=table[num_shared], num_tokens=cached % size),)
        self._seqs[seq.seq_id] = _SeqState(table, node, cached)
        self.stats.queries += 1
        self.stats.query_tokens += len(seq.token_ids)
        if cached:
            self.stats.hits += 1
            self.stats.hit_tokens += cached
        self._track()
        return Allocation(num_cached_tokens=cached, copies=copies)

    def _take(self, count: int) -> list[int]:
        if count > self.pool.num_empty:
            self.stats.evictions += self.tree.evict(count)
        blocks = self.pool.take(count)
        self._track()
        return blocks

    # -- publishing and release -------------------------------------------------------------------------
    def commit(self, seq: CacheSequence) -> None:
        state = self._seqs.get(seq.seq_id)
        if state is not None:
            computed = min(seq.num_computed_tokens, len(state.table) * self.block_size)
            self._publish(seq, state, computed - computed % self.block_size)

    def free(self, seq: CacheSequence) -> None:
        state = self._seqs.pop(seq.seq_id, None)
        if state is None:
            return
        self._publish(seq, state, min(seq.num_computed_tokens, len(state.table) * self.block_size))
        self.tree.unlock(state.node)
        for block in state.table:
            self.pool.adjust(block, seq=-1)
        self._track()

    def _publish(self, seq: CacheSequence, state: _SeqState, num_tokens: int) -> None:
        """Insert ``seq.token_ids[:num_tokens]`` into the tree and move the sequence's lock to its new end."""
        if num_tokens <= state.inserted:
            return
        node = self.tree.insert(seq.extra_keys, seq.token_ids, num_tokens, state.table, state.node)
        self.tree.lock(node)
        self.tree.unlock(state.node)
        state.node, state.inserted = node, num_tokens
        self._track()

    def reset(self) -> bool:
        if self.pool.num_free < self.num_blocks:
            return False
        self.tree.clear()
        self._track()
        return True

    def _track(self) -> None:
        self.track_usage(self.num_blocks - self.pool.num_free)
