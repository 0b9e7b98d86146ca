"""BlockPool: the paged pool of the hash-chain cache, with its digest index and LRU free queue.

A block is in exactly one of three states:

- *referenced* (``ref_count > 0``): in the block table of at least one live sequence;
- *cached* (``ref_count == 0`` and a digest): its KV is kept for reuse, in the LRU queue, findable by digest;
- *empty* (``ref_count == 0``, no digest): holds nothing worth keeping.

Allocation takes empty blocks first, the most recently emptied one first, and only then evicts cached ones,
least recently released first. Empty blocks form a stack because a block used a moment ago has its pages
mapped and maybe cached: taken first-in-first-out, a pool of thousands of blocks hands every new request
pages that were never touched, and each first write faults (127,000 faults, about 0.6 s, per run of the mixed
batch on a 2-core VM).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(eq=False)
class Block:
    """One block's bookkeeping: who references it and, when it is full and published, what it holds."""

    block_id: int
    ref_count: int = 0
    digest: bytes | None = None
    parent: bytes | None = None
    token_ids: tuple[int, ...] = ()
    extra_keys: tuple[str, ...] = ()

    def holds(self, parent: bytes | None, token_ids: tuple[int, ...], extra_keys: tuple[str, ...]) -> bool:
        """Whether this block's KV is that of ``token_ids`` after the prefix whose digest is ``parent``."""
        return self.token_ids == token_ids and self.parent == parent and self.extra_keys == extra_keys


class BlockPool:
    """Blocks, reference counts, the digest index and the free queue; every operation is O(1) per block."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._empty: list[int] = list(reversed(range(num_blocks)))  # a stack: block 0 on top
        # Cached, unreferenced blocks; insertion order is release order, so the first one is the LRU victim.
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._by_digest: dict[bytes, int] = {}
        self.num_referenced = 0

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take now (empty or evictable)."""
        return len(self._empty) + len(self._cached)

    def lookup(self, digest: bytes) -> Block | None:
        """The block published under ``digest``, referenced or not."""
        block_id = self._by_digest.get(digest)
        return None if block_id is None else self.blocks[block_id]

    def take(self, count: int) -> tuple[list[int], int]:
        """Take ``count`` blocks (ref 1 each), evicting LRU cached ones if needed; returns them and the evictions.

        The caller has checked ``count <= num_free``.
        """
        taken: list[int] = []
        evicted = 0
        for _ in range(count):
            if self._empty:
                block_id = self._empty.pop()
            else:
                block_id, _ = self._cached.popitem(last=False)
                self._forget(self.blocks[block_id])
                evicted += 1
            self.blocks[block_id].ref_count = 1
            taken.append(block_id)
        self.num_referenced += count
        return taken, evicted

    def ref(self, block_id: int) -> None:
        """Add a reference; a cached block leaves the free queue."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._cached[block_id]
            self.num_referenced += 1
        block.ref_count += 1

    def unref(self, block_id: int) -> None:
        """Drop a reference; at zero the block joins the tail of the LRU queue (or the empty ones)."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.num_referenced -= 1
            if block.digest is None:
                self._empty.append(block_id)
            else:
                self._cached[block_id] = None

    def publish(self, block_id: int, digest: bytes, parent: bytes | None, token_ids: tuple[int, ...],
                extra_keys: tuple[str, ...]) -> None:
        """Make a full, referenced block findable under ``digest`` (which no block holds yet)."""
        block = self.blocks[block_id]
        block.digest, block.parent, block.token_ids, block.extra_keys = digest, parent, token_ids, extra_keys
        self._by_digest[digest] = block_id

    def is_cached_free(self, block_id: int) -> bool:
        return block_id in self._cached

    def is_empty(self, block_id: int) -> bool:
        return self.blocks[block_id].ref_count == 0 and block_id not in self._cached

    def lru_order(self) -> list[int]:
        """Cached, unreferenced blocks from the next eviction victim to the most recently released."""
        return list(self._cached)

    def clear_cached(self) -> None:
        """Forget every cached, unreferenced block (they become empty); referenced ones are left alone."""
        for block_id in self._cached:
            self._forget(self.blocks[block_id])
            self._empty.append(block_id)
        self._cached.clear()

    def _forget(self, block: Block) -> None:
        del self._by_digest[block.digest]  # type: ignore[arg-type]
        block.digest, block.parent, block.token_ids, block.extra_keys = None, None, (), ()
