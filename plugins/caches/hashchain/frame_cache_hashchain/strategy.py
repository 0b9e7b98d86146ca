"""HashChainCache: vLLM-style prefix caching over full blocks keyed by a chained digest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixClaim, PrefixMatch, window_of

from frame_cache_hashchain.digest import DigestFn, block_digest
from frame_cache_hashchain.pool import BlockPool


@dataclass(frozen=True)
class ChainHit:
    """The handle of a :class:`PrefixMatch`: ``(block id, digest)`` of each matched block, for ``seq_id``."""

    seq_id: str
    blocks: tuple[tuple[int, bytes], ...]


@dataclass(frozen=True)
class WindowHit:
    """The handle of a windowed group's match: the blocks from index ``first`` on that its window reads."""

    seq_id: str
    first: int
    blocks: tuple[tuple[int, bytes], ...]


@dataclass
class ChainState:
    """How far a live sequence's chain of digests has been published.

    ``publishing`` turns False once one of its blocks collided with a different block's digest: the digests of
    its later blocks would chain from an ambiguous parent, so it publishes nothing more.
    """

    num_published: int = 0
    publishing: bool = True


class HashChainCache(KVCacheStrategy):
    """Full blocks are published under ``digest(parent digest, token ids, extra keys)`` and shared by refcount.

    A sequence's block digests are computed once, as its blocks fill, and kept until it is freed (vLLM keeps
    ``request.block_hashes`` the same way), so ranking a long waiting queue by cached prefix every step costs
    dict lookups, not hashing. ``lookup`` walks the chain with one dict lookup per block and accepts a block
    only if its stored token ids, parent digest and extra keys equal the query's, so a digest collision can never
    serve another prompt's KV. Freed blocks keep their contents until evicted, least recently released first.
    """

    def __init__(self, num_blocks: int, block_size: int, digest: DigestFn = block_digest) -> None:
        super().__init__(num_blocks, block_size)
        self.digest = digest
        self.pool = BlockPool(num_blocks)
        self._digests: dict[str, list[bytes]] = {}

    def digests(self, seq: CacheSequence, count: int) -> list[bytes]:
        """The digests of ``seq``'s first ``count`` full blocks (computed once each, then remembered)."""
        known = self._digests.setdefault(seq.seq_id, [])
        tokens, size, keys = seq.token_ids, self.block_size, seq.extra_keys
        while len(known) < count:
            index = len(known)
            known.append(self.digest(known[-1] if known else None, tokens[index * size:(index + 1) * size], keys))
        return known

    def _chunk(self, seq: CacheSequence, index: int) -> tuple[int, ...]:
        return tuple(seq.token_ids[index * self.block_size:(index + 1) * self.block_size])

    # -- lookups ----------------------------------------------------------------------------------------
    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        window = window_of(seq)
        if window is not None:
            return self._window_lookup(seq, window, (len(seq.token_ids) - 1) // self.block_size)
        hits: list[tuple[int, bytes]] = []
        parent: bytes | None = None
        for index, digest in enumerate(self.digests(seq, (len(seq.token_ids) - 1) // self.block_size)):
            block = self.pool.lookup(digest)
            if block is None or not block.holds(parent, self._chunk(seq, index), seq.extra_keys):
                break
            hits.append((block.block_id, digest))
            parent = digest
        return PrefixMatch(len(hits) * self.block_size, ChainHit(seq.seq_id, tuple(hits)))

    def _window_lookup(self, seq: CacheSequence, window: int, count: int) -> PrefixMatch:
        """The longest prefix of at most ``count`` blocks whose last ``window`` positions are cached: a sliding
        layer reads nothing before them, so earlier blocks may be gone (vLLM's sliding-window hit, found here
        left to right over the chain's digests, which do not need the blocks they chain from)."""
        digests = self.digests(seq, count)
        run, best = 0, 0
        for index in range(count):
            block = self.pool.lookup(digests[index])
            if block is None or not block.holds(digests[index - 1] if index else None, self._chunk(seq, index),
                                                seq.extra_keys):
                run = 0
                continue
            run += 1
            if index + 1 - run <= self._window_start(index + 1, window):
                best = index + 1
        first = self._window_start(best, window)
        hits = tuple((self.pool.lookup(d).block_id, d) for d in digests[first:best])  # type: ignore[union-attr]
        return PrefixMatch(best * self.block_size, WindowHit(seq.seq_id, first, hits))

    def _window_start(self, num_blocks: int, window: int) -> int:
        """The first block a query right after ``num_blocks`` full blocks reads through ``window``."""
        return max(num_blocks * self.block_size - window, 0) // self.block_size

    def plan_claim(self, seq: CacheSequence, match: PrefixMatch) -> PrefixClaim:
        """The matched blocks still valid now (a stale or foreign handle is looked up again)."""
        window = window_of(seq)
        if window is not None:
            found = self._window_lookup(seq, window, match.num_tokens // self.block_size)
            hit: WindowHit = found.handle
            blocks = tuple(block_id for block_id, _ in hit.blocks)
            revived = sum(1 for block_id in blocks if self.pool.blocks[block_id].ref_count == 0)
            return PrefixClaim(found.num_tokens, blocks, newly_pinned=revived, first_block=hit.first)
        handle = match.handle
        if not isinstance(handle, ChainHit) or handle.seq_id != seq.seq_id:
            handle = self.lookup(seq).handle
        valid: list[int] = []
        parent: bytes | None = None
        for index, (block_id, digest) in enumerate(handle.blocks[:match.num_tokens // self.block_size]):
            block = self.pool.lookup(digest)
            if block is None or block.block_id != block_id or not block.holds(parent, self._chunk(seq, index),
                                                                               seq.extra_keys):
                break
            valid.append(block_id)
            parent = digest
        # Claimed blocks that sit in the free queue stop being free once referenced.
        revived = sum(1 for block_id in valid if self.pool.blocks[block_id].ref_count == 0)
        return PrefixClaim(len(valid) * self.block_size, tuple(valid), newly_pinned=revived)

    def claim(self, seq: CacheSequence, plan: PrefixClaim) -> ChainState:
        for block_id in plan.shared_blocks:
            self.pool.ref(block_id)
        return ChainState(num_published=plan.first_block + len(plan.shared_blocks))

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def take(self, count: int) -> list[int]:
        blocks, evicted = self.pool.take(count)
        self.stats.evictions += evicted
        return blocks

    # -- publishing and release -------------------------------------------------------------------------
    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> ChainState:
        num_full = num_tokens // self.block_size
        if not state.publishing or state.num_published >= num_full:
            return state
        digests = self.digests(seq, num_full)
        while state.num_published < num_full:
            index = state.num_published
            parent = digests[index - 1] if index else None
            chunk = self._chunk(seq, index)
            existing = self.pool.lookup(digests[index])
            if existing is None:
                self.pool.publish(table[index], digests[index], parent, chunk, seq.extra_keys)
            elif not existing.holds(parent, chunk, seq.extra_keys):
                state.publishing = False
                break
            # else: the same block was computed twice concurrently; the published one stays, ours stays private.
            state.num_published = index + 1
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        # Tail blocks first, so that a prompt's later blocks are evicted before its earlier (more shared) ones.
        for block_id in reversed(table):
            self.pool.unref(block_id)

    def forget(self, seq_id: str) -> None:
        self._digests.pop(seq_id, None)

    def clear(self) -> None:
        self.pool.clear_cached()
