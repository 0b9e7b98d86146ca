"""RefPool: the radix cache's paged pool, with the three kinds of reference a block can have.

- ``seq_refs[b]``: live sequences whose block table holds ``b``;
- ``node_refs[b]``: radix-tree nodes whose token span lies (partly) in ``b``;
- ``pins[b]``: *locked* tree nodes (on the path of a live sequence) among those.

A block is *free* when it has no reference at all (it is then on the empty stack), *evictable* when only
unlocked tree nodes hold it, and *in use* otherwise. The count of evictable blocks is kept up to date on every
change, so ``num_free`` is O(1). Empty blocks are taken most recently emptied first: their pages are mapped and
maybe cached, where a first-in-first-out queue over a large pool hands out untouched pages that fault on
their first write.
"""

from __future__ import annotations


class RefPool:
    """Reference counts per block, the empty stack and the evictable count."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.seq_refs = [0] * num_blocks
        self.node_refs = [0] * num_blocks
        self.pins = [0] * num_blocks
        self._empty: list[int] = list(reversed(range(num_blocks)))  # a stack: block 0 on top
        self.num_evictable = 0

    @property
    def num_empty(self) -> int:
        return len(self._empty)

    @property
    def num_free(self) -> int:
        """Blocks an allocation may obtain: empty now, or freed by evicting unlocked tree nodes."""
        return len(self._empty) + self.num_evictable

    def is_free(self, block: int) -> bool:
        return not (self.seq_refs[block] or self.node_refs[block] or self.pins[block])

    def is_evictable(self, block: int) -> bool:
        return self.node_refs[block] > 0 and not self.seq_refs[block] and not self.pins[block]

    def empty_blocks(self) -> list[int]:
        return list(self._empty)

    def take(self, count: int) -> list[int]:
        """Take ``count`` empty blocks for one sequence (the caller evicted enough first)."""
        if count > len(self._empty):
            raise RuntimeError(f"asked for {count} blocks with {len(self._empty)} empty; evict first")
        taken = [self._empty.pop() for _ in range(count)]
        for block in taken:
            self.seq_refs[block] = 1
        return taken

    def adjust(self, block: int | None, seq: int = 0, node: int = 0, pin: int = 0) -> bool:
        """Change ``block``'s counts by the deltas; returns True when that made it free (it joins the stack).
        None (a windowed group's node position whose block was given back) has no counts."""
        if block is None:
            return False
        was_free, was_evictable = self.is_free(block), self.is_evictable(block)
        self.seq_refs[block] += seq
        self.node_refs[block] += node
        self.pins[block] += pin
        if min(self.seq_refs[block], self.node_refs[block], self.pins[block]) < 0:
            raise RuntimeError(f"block {block}: a reference count went negative")
        self.num_evictable += self.is_evictable(block) - was_evictable
        if self.is_free(block) and not was_free:
            self._empty.append(block)
            return True
        return False
