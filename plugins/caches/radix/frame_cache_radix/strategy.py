"""RadixCache: SGLang-style token-granular prefix caching over a paged pool."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixClaim, PrefixMatch, held_from, window_of

from frame_cache_radix.pool import RefPool
from frame_cache_radix.tree import Node, RadixTree


@dataclass
class RadixState:
    """A live sequence's place in the tree: ``node`` is the deepest node of its locked path and covers
    ``tokens[:inserted]`` (``node.end == inserted``; None when nothing is inserted yet). A windowed group's
    ``tail`` is the unlocked node that ends where the blocks it gave back end (None: none yet, or evicted)."""

    node: Node | None = None
    inserted: int = 0
    tail: Node | None = None


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
        window = window_of(seq)
        if window is not None:
            num_tokens, node, _ = self._in_window(num_tokens, node, window)
        return PrefixMatch(num_tokens, node)

    def _in_window(self, cached: int, node: Node | None, window: int) -> tuple[int, Node | None, list[int | None]]:
        """The longest part of a windowed group's match whose last ``window`` positions have their blocks (a
        node keeps None where the sequence that inserted it had given its block back): the match, its deepest
        node and the block of each index."""
        size = self.block_size
        while cached > 0 and node is not None:
            owners, _ = self.tree.path_blocks(node, cached)
            holes = [i for i in range(max(cached - window, 0) // size, len(owners)) if owners[i] is None]
            if not holes:
                return cached, node, owners
            cached = holes[-1] * size
            while node is not None and node.start >= cached:
                node = node.parent if node.parent is not None and node.parent.parent is not None else None
        return 0, None, []

    def _lookup(self, seq: CacheSequence, limit: int) -> tuple[int, Node | None]:
        if limit <= 0:
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
        window = window_of(seq)
        if window is not None:
            cached, node, _ = self._in_window(cached, node, window)
        owners, referenced = self.tree.path_blocks(node, cached)
        num_shared = cached // self.block_size
        # A windowed group holds only the blocks its window reads; the earlier positions stay unheld.
        first = max(cached - window, 0) // self.block_size if window is not None else 0
        # Locking the matched path pins its blocks; those that were evictable stop counting as free.
        pinned = sum(1 for block in referenced if self.pool.is_evictable(block))
        partial = owners[num_shared] if cached % self.block_size else None
        shared = tuple(owners[first:num_shared])
        return PrefixClaim(cached, shared, partial, pinned, (node, cached), first_block=first)  # type: ignore[arg-type]

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
        A windowed KV group enters the tree only at :meth:`release`: a locked path would pin the blocks its
        window gives back while it runs."""
        if num_tokens <= state.inserted or window_of(seq) is not None:
            return state
        node = self.tree.insert(seq.extra_keys, seq.token_ids, num_tokens, table, state.node)
        self.tree.lock(node)
        self.tree.unlock(state.node)
        state.node, state.inserted = node, num_tokens
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        if window_of(seq) is not None:
            self._insert_window(seq, [None] * held_from(seq) + table, num_computed, state)
            self.tree.unlock(state.node)
            for block in table:
                self.pool.adjust(block, seq=-1)
            return
        state = self.publish(seq, table, state, num_computed)
        self.tree.unlock(state.node)
        for block in table:
            self.pool.adjust(block, seq=-1)

    def release_blocks(self, seq: CacheSequence, blocks: list[int], state: Any) -> None:
        """Blocks a windowed group gave back enter the tree unlocked (evictable, reusable while they last)."""
        first = held_from(seq)
        self._insert_window(seq, [None] * first + blocks, (first + len(blocks)) * self.block_size, state)
        for block in blocks:
            self.pool.adjust(block, seq=-1)

    def _insert_window(self, seq: CacheSequence, table: list[int | None], num_tokens: int, state: RadixState) -> None:
        """Insert a windowed group's ``tokens[:num_tokens]`` below its last unlocked node (or its locked path),
        as a new leaf: its positions before the sequence's window are holes (None), as SGLang's sliding-window
        radix cache keeps tombstones where window KV was freed."""
        start = state.tail if state.tail is not None and state.tail.alive else state.node
        if num_tokens > (start.end if start is not None else 0):
            state.tail = self.tree.insert(seq.extra_keys, seq.token_ids, num_tokens, table, start, extend=False)

    def clear(self) -> None:
        self.tree.clear()
