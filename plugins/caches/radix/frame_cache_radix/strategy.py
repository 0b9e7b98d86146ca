"""RadixCache: SGLang-style token-granular prefix caching over a paged pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixClaim, PrefixMatch, window_of

from frame_cache_radix.pool import RefPool
from frame_cache_radix.tree import Node, RadixTree


@dataclass
class RadixState:
    """A live sequence's place in the tree: ``node`` is the deepest node of its locked path and covers
    ``tokens[:inserted]`` (``node.end == inserted``; None when nothing is inserted yet)."""

    node: Node | None = None
    inserted: int = 0


class RadixCache(KVCacheStrategy):
    """Prefix reuse at token granularity: full blocks are shared by reference, a partly matched block is copied.

    A match may end inside a block that the tree owns. The sequence cannot share that block, because it will
    write its own next tokens into the block's remaining slots (which hold another branch's KV), so it gets a
    fresh block and a copy of the matched slots (the core orders the copy); every full block before it is shared.

    Sequences enter the tree at :meth:`publish` (their full blocks) and at :meth:`release` (everything computed,
    including a partial last block, which the tree then owns). The tree only ever holds blocks that no sequence
    will write again. A live sequence locks its path; eviction frees unlocked leaves, least recently used first.
    """

    def __init__(self, num_blocks: int, block_size: int, partial_block_reuse: bool = True) -> None:
        super().__init__(num_blocks, block_size)
        self.partial_block_reuse = partial_block_reuse
        self.pool = RefPool(num_blocks)
        self.tree = RadixTree(self.pool, block_size)

    # -- lookups ----------------------------------------------------------------------------------------
    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        num_tokens, node = self._lookup(seq, len(seq.token_ids) - 1)
        return PrefixMatch(num_tokens, node)

    def _lookup(self, seq: CacheSequence, limit: int) -> tuple[int, Node | None]:
        if limit <= 0 or window_of(seq) is not None:
            return 0, None
        num_tokens, node = self.tree.match(seq.extra_keys, seq.token_ids, limit)
        if not self.partial_block_reuse:
            num_tokens -= num_tokens % self.block_size
            while node is not None and node.start >= num_tokens:
                node = node.parent if node.parent is not None and node.parent.parent is not None else None
        return num_tokens, node if num_tokens else None

    def plan_claim(self, seq: CacheSequence, match: PrefixMatch) -> PrefixClaim:
        # Look again: the tree may have changed since match(); never claim more than the caller planned for.
        cached, node = self._lookup(seq, min(match.num_tokens, len(seq.token_ids) - 1))
        owners, referenced = self.tree.path_blocks(node, cached)
        num_shared = cached // self.block_size
        # Locking the matched path pins its blocks; those that were evictable stop counting as free.
        pinned = sum(1 for block in referenced if self.pool.is_evictable(block))
        partial = owners[num_shared] if cached % self.block_size else None
        return PrefixClaim(cached, tuple(owners[:num_shared]), partial, pinned, (node, cached))

    def claim(self, seq: CacheSequence, plan: PrefixClaim) -> RadixState:
        node, cached = plan.handle if plan.handle is not None else (None, 0)
        if node is not None and node.end > cached:
            node = self.tree.split(node, cached - node.start)
        self.tree.lock(node)
        for block in plan.shared_blocks:
            self.pool.adjust(block, seq=1)
        return RadixState(node, cached)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def take(self, count: int) -> list[int]:
        if count > self.pool.num_empty:
            self.stats.evictions += self.tree.evict(count)
        return self.pool.take(count)

    # -- publishing and release -------------------------------------------------------------------------
    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> RadixState:
        """Insert ``seq.token_ids[:num_tokens]`` into the tree and move the sequence's lock to its new end.
        A windowed KV group's blocks stay out of the tree: its locked path would pin the blocks its window gave
        back (reusing them needs a node whose early blocks may be gone, SGLang's SWA tombstones; not done)."""
        if num_tokens <= state.inserted or window_of(seq) is not None:
            return state
        node = self.tree.insert(seq.extra_keys, seq.token_ids, num_tokens, table, state.node)
        self.tree.lock(node)
        self.tree.unlock(state.node)
        state.node, state.inserted = node, num_tokens
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        state = self.publish(seq, table, state, num_computed)
        self.tree.unlock(state.node)
        for block in table:
            self.pool.adjust(block, seq=-1)

    def release_blocks(self, seq: CacheSequence, blocks: list[int], state: Any) -> None:
        """A windowed group's blocks are the sequence's alone (never in the tree): they become empty."""
        for block in blocks:
            self.pool.adjust(block, seq=-1)

    def clear(self) -> None:
        self.tree.clear()
