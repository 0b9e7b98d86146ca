"""KVCacheStrategy: bookkeeping over block ids that decides which KV blocks a sequence uses and reuses.

The KV pool is paged in every strategy: ``num_blocks`` blocks of ``block_size`` token slots each, slot
``block_id * block_size + offset``. The work is split in two (plugin API 2):

- the core half, in :class:`KVCacheStrategy` itself: each live sequence's block table, growing it as the
  sequence grows, the all-or-nothing capacity check of an admission, the copy order for a partial-block hit,
  and the statistics. The scheduler calls only these methods (:meth:`~KVCacheStrategy.match`,
  :meth:`~KVCacheStrategy.allocate`, :meth:`~KVCacheStrategy.commit`, :meth:`~KVCacheStrategy.free`, ...).
- the strategy half, which a plugin implements: find a reusable prefix (:meth:`~KVCacheStrategy.lookup`), claim
  it (:meth:`~KVCacheStrategy.plan_claim`, :meth:`~KVCacheStrategy.claim`), hand out free blocks evicting by its
  own policy (:meth:`~KVCacheStrategy.take`; least recently used in-tree, but LFU or size-aware policies are
  equally legal), make computed KV reusable (:meth:`~KVCacheStrategy.publish`) and let go of a sequence's
  blocks (:meth:`~KVCacheStrategy.release`).

A strategy never touches tensors: when reuse needs KV moved (a partial block copied for a token-granular hit),
the core emits a :class:`BlockCopy` and the model runner performs it before the step's forward. Strategies see
sequences through :class:`CacheSequence` (``frame.sequence.Sequence`` satisfies it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, ClassVar

from frame.interfaces.cache.values import (
    NO_CLAIM,
    Allocation,
    BlockCopy,
    CacheSequence,
    CacheStats,
    GroupSequence,
    PrefixClaim,
    PrefixMatch,
)

__all__ = ["KVCacheStrategy"]


@dataclass
class _Holding:
    """A live sequence's block table per KV group and the strategy's private state for each.

    ``tables[g]`` is indexed by block position; its first ``first[g]`` entries are not held (blocks a windowed
    group gave back, or never claimed): they name blocks the sequence no longer owns, which its attention never
    reads (they lie wholly before its window)."""

    tables: list[list[int]]
    states: list[Any]
    first: list[int]


@dataclass(frozen=True)
class _GroupMatches:
    """The handle of a match over several KV groups: each group's own handle."""

    handles: tuple[Any, ...]


class KVCacheStrategy(ABC):
    """Allocates, shares, caches and evicts the KV blocks of a paged pool.

    The scheduler drives the core half: :meth:`match` then :meth:`allocate` when admitting a sequence,
    :meth:`allocate` again before each step that adds tokens, :meth:`commit` after the step wrote KV, :meth:`free`
    when the sequence finishes, aborts or is preempted. Every method is called from the engine core's single
    thread. A plugin subclasses this and implements the abstract strategy half; it must not override the core
    half.

    KV groups (:mod:`frame.interfaces.kv_groups`, set by :meth:`set_groups`): a model whose layers keep different
    windows has one block table per group and request, all drawn from the one pool. The core half calls the
    strategy half once per group, with a :class:`GroupSequence` (its own ``seq_id`` and extra keys per group, so
    groups never share a block, and the group's ``window``); it gives back the blocks a windowed group no longer
    reads (:meth:`release_blocks`), and a prefix hit is the longest one every group can serve.

    ``reuses_prefixes``: False for a strategy whose :meth:`lookup` is always empty; the engine then never holds a
    request back to share a prefix. ``eviction_policy``: a word for people and for the conformance suite
    (``"lru"`` is checked to evict least recently released first; any other policy only has to be correct).
    """

    reuses_prefixes: ClassVar[bool] = True
    eviction_policy: ClassVar[str] = "lru"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV pool needs at least one block of one slot, got {num_blocks}x{block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.stats = CacheStats(num_blocks=num_blocks)
        self._holdings: dict[str, _Holding] = {}
        self.set_groups((None,))

    # == the core half: what the scheduler calls ===========================================================
    def set_groups(self, windows: Seq[int | None]) -> None:
        """Use one block table per KV group, group ``g`` attending through ``windows[g]`` (None: every key).
        Called by the engine core before the first request; the default is one full-attention group."""
        if self._holdings:
            raise RuntimeError("KV groups can change only while no sequence holds blocks")
        if not windows or any(w is not None and w < 1 for w in windows):
            raise ValueError(f"KV groups need at least one group and positive windows, got {list(windows)}")
        self.windows = tuple(windows)
        self._group_refs: list[dict[int, int]] = [{} for _ in self.windows]
        self.stats.group_blocks_in_use = [0] * len(self.windows)
        self.stats.peak_group_blocks_in_use = [0] * len(self.windows)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    def _views(self, seq: CacheSequence) -> list[GroupSequence]:
        return [GroupSequence(seq, g, w) for g, w in enumerate(self.windows)]

    def match(self, seq: CacheSequence) -> PrefixMatch:
        """The longest reusable prefix of ``seq.token_ids`` now (honouring ``seq.extra_keys``); no side effects.

        Called for a sequence that holds no blocks (before admitting it), and by cache-aware policies to rank
        waiting sequences. Never more than ``len(seq.token_ids) - 1`` tokens; with several KV groups, the
        shortest of the groups' matches.
        """
        if len(seq.token_ids) <= 1:
            return PrefixMatch(0)
        found = [self.lookup(view) for view in self._views(seq)]
        limit = min([len(seq.token_ids) - 1, *(f.num_tokens for f in found)])
        handle = found[0].handle if len(found) == 1 else _GroupMatches(tuple(f.handle for f in found))
        return PrefixMatch(limit, handle)

    def allocate(
        self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None = None
    ) -> Allocation | None:
        """Make room for ``num_new_tokens`` more tokens of ``seq`` and return the allocation, or None.

        On a sequence that holds no blocks, ``match`` (from :meth:`match`, just before) is claimed first: its
        blocks are referenced (or copied) and ``Allocation.num_cached_tokens`` says how many tokens they cover;
        the new tokens then follow them. Capacity is ensured for ``seq.num_computed_tokens + num_cached_tokens +
        num_new_tokens`` tokens in every group, evicting cached blocks by the strategy's policy if needed. Returns
        None, with no side effects at all, when the pool cannot provide that many blocks.
        """
        holding = self._holdings.get(seq.seq_id)
        if holding is not None:
            needed = self.num_blocks_needed(seq.num_computed_tokens + num_new_tokens)
            missing = [max(needed - len(table), 0) for table in holding.tables]
            if sum(missing) > self.num_free_blocks:
                return None
            for g, count in enumerate(missing):
                if count:
                    holding.tables[g].extend(self._take(g, count))
            if any(missing):
                self._track()
            return Allocation()
        return self._admit(seq, num_new_tokens, match)

    def _plans(self, views: list[GroupSequence], match: PrefixMatch | None) -> list[PrefixClaim]:
        """Every group's claim of ``match``, cut to the tokens all of them can serve now."""
        num_tokens = match.num_tokens if match is not None else 0
        handles = match.handle.handles if match is not None and isinstance(match.handle, _GroupMatches) else None
        while num_tokens > 0:
            plans = [self.plan_claim(view, PrefixMatch(num_tokens, match.handle if handles is None  # type: ignore[union-attr]
                                                       else handles[view.group])) for view in views]
            served = min(plan.num_tokens for plan in plans)
            if all(plan.num_tokens == served for plan in plans):
                return plans
            num_tokens = served
        return [NO_CLAIM] * len(views)

    def _admit(self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None) -> Allocation | None:
        views = self._views(seq)
        plans = self._plans(views, match if not seq.num_computed_tokens else None)
        cached = plans[0].num_tokens
        needed = self.num_blocks_needed(seq.num_computed_tokens + cached + num_new_tokens)
        missing = [max(needed - plan.first_block - len(plan.shared_blocks), 0) for plan in plans]
        if sum(missing) + sum(plan.newly_pinned for plan in plans) > self.num_free_blocks:
            return None
        tables: list[list[int]] = []
        states: list[Any] = []
        copies: list[BlockCopy] = []
        # Every group claims (locks) its match before any takes: a take may evict, and must not evict what
        # another group's plan is about to claim.
        for view, plan in zip(views, plans, strict=True):
            states.append(self.claim(view, plan))
            self._count(view.group, plan.shared_blocks, 1)
        for view, plan, count in zip(views, plans, missing, strict=True):
            own = [*plan.shared_blocks, *self._take(view.group, count)]
            # Positions before a windowed claim are never read: they name a block the sequence does hold.
            tables.append([own[0]] * plan.first_block + own)
            shared = plan.first_block + len(plan.shared_blocks)
            if plan.partial_src is not None and plan.num_tokens % self.block_size:
                copies.append(BlockCopy(src=plan.partial_src, dst=tables[-1][shared],
                                        num_tokens=plan.num_tokens % self.block_size))
        self._holdings[seq.seq_id] = _Holding(tables, states, [plan.first_block for plan in plans])
        self.stats.queries += 1
        self.stats.query_tokens += len(seq.token_ids)
        if cached:
            self.stats.hits += 1
            self.stats.hit_tokens += cached
        self._track()
        return Allocation(num_cached_tokens=cached, copies=tuple(copies))

    def commit(self, seq: CacheSequence) -> None:
        """Record that KV for ``seq.token_ids[:seq.num_computed_tokens]`` is written: the strategy may publish the
        full blocks among them for reuse, and a windowed group gives back the blocks wholly before its window.
        Called after every step that computed tokens of ``seq``."""
        holding = self._holdings.get(seq.seq_id)
        if holding is None:
            return
        for view in self._views(seq):
            g, table = view.group, holding.tables[view.group]
            computed = min(seq.num_computed_tokens, len(table) * self.block_size)
            holding.states[g] = self.publish(view, table, holding.states[g], computed - computed % self.block_size)
            if view.window is not None:
                # The next query, at position ``computed``, reads keys from ``computed - window + 1`` on.
                unread = min(max(computed - view.window, 0) // self.block_size, len(table))
                if unread > holding.first[g]:
                    dropped = table[holding.first[g]:unread]
                    view.held_from = holding.first[g]
                    self.release_blocks(view, dropped, holding.states[g])
                    self._count(g, dropped, -1)
                    holding.first[g] = unread
        self._track()

    def free(self, seq: CacheSequence) -> None:
        """Release every block ``seq`` holds (finish, abort or preemption). Idempotent.

        Computed KV stays cached for reuse (as the strategy decides) until evicted; the block table is forgotten.
        """
        holding = self._holdings.pop(seq.seq_id, None)
        if holding is not None:
            for g, window in enumerate(self.windows):
                table, first = holding.tables[g], holding.first[g]
                view = GroupSequence(seq, g, window, held_from=first)
                computed = min(seq.num_computed_tokens, len(table) * self.block_size)
                self.release(view, table[first:], holding.states[g], computed)
                self._count(g, table[first:], -1)
            self._track()
        for view in self._views(seq):
            self.forget(view.seq_id)

    def block_table(self, seq_id: str, group: int = 0) -> Seq[int]:
        """The block ids holding ``seq_id``'s KV of KV group ``group``, by block position (empty when it holds
        none). Positions before a windowed group's window name blocks it no longer holds."""
        holding = self._holdings.get(seq_id)
        return tuple(holding.tables[group]) if holding is not None else ()

    def held_blocks(self, seq_id: str, group: int = 0) -> Seq[int]:
        """The blocks ``seq_id`` holds in KV group ``group`` (its table without the given-back positions)."""
        holding = self._holdings.get(seq_id)
        return tuple(holding.tables[group][holding.first[group]:]) if holding is not None else ()

    def live_states(self) -> dict[str, Any]:
        """The strategy's state (what :meth:`claim` returned, as :meth:`publish` updated it) of every sequence
        holding blocks, in the first KV group; for a strategy's own consistency checks in tests."""
        return {seq_id: holding.states[0] for seq_id, holding in self._holdings.items()}

    def reset(self) -> bool:
        """Drop every cached, unreferenced block. Returns False (changing nothing) while any sequence holds
        blocks."""
        if self._holdings:
            return False
        self.clear()
        self._track()
        return True

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def _take(self, group: int, count: int) -> list[int]:
        blocks = self.take(count) if count else []
        self._count(group, blocks, 1)
        return blocks

    def _count(self, group: int, blocks: Seq[int], delta: int) -> None:
        refs = self._group_refs[group]
        for block in blocks:
            left = refs.get(block, 0) + delta
            if left:
                refs[block] = left
            else:
                del refs[block]

    def _track(self) -> None:
        stats = self.stats
        in_use = self.num_blocks - self.num_free_blocks
        stats.blocks_in_use = in_use
        stats.peak_blocks_in_use = max(stats.peak_blocks_in_use, in_use)
        stats.group_blocks_in_use = [len(refs) for refs in self._group_refs]
        stats.peak_group_blocks_in_use = [max(a, b) for a, b in zip(stats.peak_group_blocks_in_use,
                                                                    stats.group_blocks_in_use, strict=True)]

    # == the strategy half: what a plugin implements ========================================================
    @abstractmethod
    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        """The longest prefix of ``seq.token_ids`` whose KV is cached under ``seq.extra_keys``; no side effects.

        ``handle`` may carry whatever :meth:`plan_claim` needs (it stays valid until the next mutating call; a
        stale one must be detected there). A strategy that reuses nothing returns ``PrefixMatch(0)``.
        """

    def plan_claim(self, seq: CacheSequence, match: PrefixMatch) -> PrefixClaim:
        """What claiming ``match`` (from :meth:`lookup`, maybe stale) for ``seq`` would take now; no side effects.

        Called on admission of a sequence that holds no blocks, when the match is not empty. Never claim more than
        ``match.num_tokens``. The default claims nothing, which is right for a strategy that reuses nothing.
        """
        return NO_CLAIM

    def claim(self, seq: CacheSequence, plan: PrefixClaim) -> Any:
        """Take ``plan``'s blocks for ``seq`` (reference, lock; they stop being free) and return the strategy's
        per-sequence state, which :meth:`publish` and :meth:`release` receive. Called once per admission, right
        before :meth:`take` gives the sequence its new blocks (also with the empty :data:`NO_CLAIM`). The default
        keeps no state, which is right for a strategy whose plans claim nothing."""
        return None

    @abstractmethod
    def take(self, count: int) -> list[int]:
        """``count`` blocks that no sequence references, now referenced once by the caller's sequence.

        The core has checked ``count <= num_free_blocks``. Take never-used blocks first; evict cached ones by the
        strategy's eviction policy only when needed, counting each in ``self.stats.evictions``.
        """

    @abstractmethod
    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> Any:
        """KV of ``seq.token_ids[:num_tokens]`` (whole blocks of ``table``) is written; make it reusable if the
        strategy wants. Returns the sequence's new state. Called after every step that computed tokens of
        ``seq``, with a non-decreasing ``num_tokens``."""

    @abstractmethod
    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        """``seq`` no longer holds ``table`` (finished, aborted or preempted); ``num_computed`` leading tokens have
        KV in it. Drop the sequence's references; keep what should stay cached (a partial last block included, if
        the strategy reuses at token granularity). For a windowed KV group, ``table`` starts at block position
        ``held_from(seq)``: the blocks before it were given back already (:meth:`release_blocks`)."""

    def release_blocks(self, seq: CacheSequence, blocks: list[int], state: Any) -> None:
        """A windowed KV group of ``seq`` (``window_of(seq)`` is set) stops holding ``blocks``: leading blocks of
        its table that fell wholly before its window, after :meth:`publish` saw them; they are the table's
        positions from ``held_from(seq)`` on. Drop the sequence's
        references, keeping published KV cached as :meth:`release` would. The default is :meth:`release` of
        those blocks with nothing computed (nothing kept beyond what is already published)."""
        self.release(seq, blocks, state, 0)

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks :meth:`take` could hand out now: never used, or cached but evictable."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every cached block (called only while no sequence holds any, by :meth:`reset`)."""

    def forget(self, seq_id: str) -> None:  # noqa: B027 - optional hook, empty by design
        """Drop anything kept about ``seq_id`` outside its holding (memoised digests); called at every
        :meth:`free`."""
