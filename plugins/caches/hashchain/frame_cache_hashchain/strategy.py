"""HashChainCache: vLLM-style prefix caching over full blocks keyed by a chained digest."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from frame.interfaces.cache import Allocation, CacheSequence, KVCacheStrategy, PrefixMatch

from frame_cache_hashchain.digest import DigestFn, block_digest
from frame_cache_hashchain.pool import BlockPool


@dataclass(frozen=True)
class ChainHit:
    """The handle of a :class:`PrefixMatch`: ``(block id, digest)`` of each matched block, for ``seq_id``."""

    seq_id: str
    blocks: tuple[tuple[int, bytes], ...]


@dataclass
class _SeqBlocks:
    """A live sequence's blocks and how far its chain of digests has been published."""

    table: list[int]
    num_hashed: int = 0
    last_digest: bytes | None = None
    # False once one of its blocks collided with a different block's digest: the digests of its later blocks
    # would chain from an ambiguous parent, so it publishes nothing more.
    publishing: bool = field(default=True)


class HashChainCache(KVCacheStrategy):
    """Full blocks are published under ``digest(parent digest, token ids, extra keys)`` and shared by refcount.

    ``match`` walks the chain block by block with one dict lookup each, and accepts a block only if its stored
    token ids, parent digest and extra keys equal the query's, so a digest collision can never serve another
    prompt's KV. Freed blocks keep their contents until evicted, least recently released first.
    """

    def __init__(self, num_blocks: int, block_size: int, digest: DigestFn = block_digest) -> None:
        super().__init__(num_blocks, block_size)
        self.digest = digest
        self.pool = BlockPool(num_blocks)
        self._seqs: dict[str, _SeqBlocks] = {}

    # -- lookups ----------------------------------------------------------------------------------------
    def match(self, seq: CacheSequence) -> PrefixMatch:
        tokens, size, keys = seq.token_ids, self.block_size, seq.extra_keys
        hits: list[tuple[int, bytes]] = []
        parent: bytes | None = None
        for index in range((len(tokens) - 1) // size):
            chunk = tuple(tokens[index * size:(index + 1) * size])
            digest = self.digest(parent, chunk, keys)
            block = self.pool.lookup(digest)
            if block is None or not block.holds(parent, chunk, keys):
                break
            hits.append((block.block_id, digest))
            parent = digest
        return PrefixMatch(len(hits) * size, ChainHit(seq.seq_id, tuple(hits)))

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

        hits = self._claimable(seq, match)
        num_cached = len(hits) * self.block_size
        missing = self.num_blocks_needed(seq.num_computed_tokens + num_cached + num_new_tokens) - len(hits)
        # Claimed blocks that sit in the free queue stop being free once referenced.
        revived = sum(1 for block_id, _ in hits if self.pool.blocks[block_id].ref_count == 0)
        if missing + revived > self.pool.num_free:
            return None
        for block_id, _ in hits:
            self.pool.ref(block_id)
        table = [block_id for block_id, _ in hits] + self._take(max(missing, 0))
        self._seqs[seq.seq_id] = _SeqBlocks(table, len(hits), hits[-1][1] if hits else None)
        self.stats.queries += 1
        self.stats.query_tokens += len(seq.token_ids)
        if num_cached:
            self.stats.hits += 1
            self.stats.hit_tokens += num_cached
        self._track()
        return Allocation(num_cached_tokens=num_cached)

    def _claimable(self, seq: CacheSequence, match: PrefixMatch | None) -> list[tuple[int, bytes]]:
        """The matched blocks still valid now (a stale or foreign handle is looked up again)."""
        if match is None or match.num_tokens <= 0 or seq.num_computed_tokens:
            return []
        limit = min(match.num_tokens, len(seq.token_ids) - 1) // self.block_size
        handle = match.handle
        if not isinstance(handle, ChainHit) or handle.seq_id != seq.seq_id:
            handle = self.match(seq).handle
        valid: list[tuple[int, bytes]] = []
        parent: bytes | None = None
        for index, (block_id, digest) in enumerate(handle.blocks[:limit]):
            block = self.pool.lookup(digest)
            chunk = tuple(seq.token_ids[index * self.block_size:(index + 1) * self.block_size])
            if block is None or block.block_id != block_id or not block.holds(parent, chunk, seq.extra_keys):
                break
            valid.append((block_id, digest))
            parent = digest
        return valid

    def _take(self, count: int) -> list[int]:
        blocks, evicted = self.pool.take(count)
        self.stats.evictions += evicted
        self._track()
        return blocks

    # -- publishing and release -------------------------------------------------------------------------
    def commit(self, seq: CacheSequence) -> None:
        state = self._seqs.get(seq.seq_id)
        if state is None:
            return
        size, keys, tokens = self.block_size, seq.extra_keys, seq.token_ids
        num_full = min(seq.num_computed_tokens, len(state.table) * size) // size
        while state.publishing and state.num_hashed < num_full:
            index = state.num_hashed
            parent = state.last_digest
            chunk = tuple(tokens[index * size:(index + 1) * size])
            digest = self.digest(parent, chunk, keys)
            existing = self.pool.lookup(digest)
            if existing is None:
                self.pool.publish(state.table[index], digest, parent, chunk, keys)
            elif not existing.holds(parent, chunk, keys):
                state.publishing = False
                break
            # else: the same block was computed twice concurrently; the published one stays, ours stays private.
            state.num_hashed, state.last_digest = index + 1, digest

    def free(self, seq: CacheSequence) -> None:
        state = self._seqs.pop(seq.seq_id, None)
        if state is None:
            return
        # Tail blocks first, so that a prompt's later blocks are evicted before its earlier (more shared) ones.
        for block_id in reversed(state.table):
            self.pool.unref(block_id)
        self._track()

    def reset(self) -> bool:
        if self.pool.num_referenced:
            return False
        self.pool.clear_cached()
        self._track()
        return True

    def _track(self) -> None:
        self.track_usage(self.num_blocks - self.pool.num_free)
