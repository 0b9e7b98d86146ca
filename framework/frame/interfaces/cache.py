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
from typing import Any, ClassVar, Protocol

import msgspec

__all__ = [
    "NO_CLAIM",
    "Allocation",
    "BlockCopy",
    "CacheSequence",
    "CacheStats",
    "KVCacheStrategy",
    "PrefixClaim",
    "PrefixMatch",
]


class BlockCopy(msgspec.Struct, frozen=True, array_like=True):
    """An order to the runner: copy the KV of slots ``[0, num_tokens)`` of ``src`` into ``dst`` (all layers).

    The cache strategy's base emits it for a prefix hit that ends inside a block (see
    :class:`~frame.interfaces.cache.PrefixClaim`); it travels in the step plan to every model worker."""

    src: int
    dst: int
    num_tokens: int


class CacheSequence(Protocol):
    """What a KV-cache strategy may read of a sequence."""

    @property
    def seq_id(self) -> str: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_computed_tokens(self) -> int: ...
    @property
    def extra_keys(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class PrefixMatch:
    """The result of :meth:`KVCacheStrategy.match`: how many leading tokens' KV could be reused now.

    ``num_tokens`` is at most ``len(token_ids) - 1`` (the last prompt token is always computed so that the step
    yields logits). ``handle`` is the strategy's private description of the hit (block ids, tree node, ...),
    valid until the strategy's next mutating call.
    """

    num_tokens: int
    handle: Any = None


@dataclass(frozen=True)
class Allocation:
    """A successful :meth:`KVCacheStrategy.allocate`.

    ``num_cached_tokens``: leading tokens whose KV the sequence now reuses (non-zero only on the call that
    claimed a prefix match); the caller advances ``num_computed_tokens`` by it. ``copies``: block copies the
    runner must perform before the next forward.
    """

    num_cached_tokens: int = 0
    copies: tuple[BlockCopy, ...] = ()


@dataclass
class CacheStats:
    """Counters a strategy keeps; all are monotonic except the block gauges.

    ``queries``/``query_tokens``: prefix lookups claimed at admission and the prompt tokens they covered;
    ``hits``/``hit_tokens``: lookups that reused anything and the tokens reused. ``evictions``: cached blocks
    dropped to make room. ``blocks_in_use``: blocks referenced by a live sequence; ``peak_blocks_in_use`` its
    maximum since the last reset of stats.
    """

    num_blocks: int = 0
    queries: int = 0
    query_tokens: int = 0
    hits: int = 0
    hit_tokens: int = 0
    evictions: int = 0
    blocks_in_use: int = 0
    peak_blocks_in_use: int = 0

    @property
    def hit_rate(self) -> float:
        """Prompt tokens reused / prompt tokens looked up."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def usage(self) -> float:
        """Fraction of the pool referenced by live sequences."""
        return self.blocks_in_use / self.num_blocks if self.num_blocks else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "hit_rate": self.hit_rate}


@dataclass(frozen=True)
class PrefixClaim:
    """What claiming a prefix match would take, worked out by :meth:`KVCacheStrategy.plan_claim` without side
    effects.

    ``shared_blocks`` are full blocks the sequence will reference as they are (its first table entries);
    ``num_tokens`` is the tokens reused: ``len(shared_blocks) * block_size``, plus ``num_tokens % block_size``
    slots of ``partial_src`` that the runner copies into the sequence's first new block (a hit that ends inside a
    block another sequence owns). ``newly_pinned`` counts blocks that are free now (evictable) and stop being
    free once claimed, so that the core can check capacity first. ``handle`` is the strategy's, for
    :meth:`KVCacheStrategy.claim`.
    """

    num_tokens: int = 0
    shared_blocks: tuple[int, ...] = ()
    partial_src: int | None = None
    newly_pinned: int = 0
    handle: Any = None


NO_CLAIM = PrefixClaim()


@dataclass
class _Holding:
    """A live sequence's block table and the strategy's private state for it."""

    table: list[int]
    state: Any = None


class KVCacheStrategy(ABC):
    """Allocates, shares, caches and evicts the KV blocks of a paged pool.

    The scheduler drives the core half: :meth:`match` then :meth:`allocate` when admitting a sequence,
    :meth:`allocate` again before each step that adds tokens, :meth:`commit` after the step wrote KV, :meth:`free`
    when the sequence finishes, aborts or is preempted. Every method is called from the engine core's single
    thread. A plugin subclasses this and implements the abstract strategy half; it must not override the core
    half.

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

    # == the core half: what the scheduler calls ===========================================================
    def match(self, seq: CacheSequence) -> PrefixMatch:
        """The longest reusable prefix of ``seq.token_ids`` now (honouring ``seq.extra_keys``); no side effects.

        Called for a sequence that holds no blocks (before admitting it), and by cache-aware policies to rank
        waiting sequences. Never more than ``len(seq.token_ids) - 1`` tokens.
        """
        if len(seq.token_ids) <= 1:
            return PrefixMatch(0)
        found = self.lookup(seq)
        limit = len(seq.token_ids) - 1
        return found if found.num_tokens <= limit else PrefixMatch(limit, found.handle)

    def allocate(
        self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None = None
    ) -> Allocation | None:
        """Make room for ``num_new_tokens`` more tokens of ``seq`` and return the allocation, or None.

        On a sequence that holds no blocks, ``match`` (from :meth:`match`, just before) is claimed first: its
        blocks are referenced (or copied) and ``Allocation.num_cached_tokens`` says how many tokens they cover;
        the new tokens then follow them. Capacity is ensured for ``seq.num_computed_tokens + num_cached_tokens +
        num_new_tokens`` tokens, evicting cached blocks by the strategy's policy if needed. Returns None, with no
        side effects at all, when the pool cannot provide that many blocks.
        """
        holding = self._holdings.get(seq.seq_id)
        if holding is not None:
            missing = self.num_blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(holding.table)
            if missing > 0:
                if missing > self.num_free_blocks:
                    return None
                holding.table.extend(self.take(missing))
                self._track()
            return Allocation()
        return self._admit(seq, num_new_tokens, match)

    def _admit(self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None) -> Allocation | None:
        plan = NO_CLAIM
        if match is not None and match.num_tokens > 0 and not seq.num_computed_tokens:
            plan = self.plan_claim(seq, match)
        shared = len(plan.shared_blocks)
        missing = self.num_blocks_needed(seq.num_computed_tokens + plan.num_tokens + num_new_tokens) - shared
        if max(missing, 0) + plan.newly_pinned > self.num_free_blocks:
            return None
        state = self.claim(seq, plan)
        table = [*plan.shared_blocks, *self.take(max(missing, 0))]
        self._holdings[seq.seq_id] = _Holding(table, state)
        copies: tuple[BlockCopy, ...] = ()
        if plan.partial_src is not None and plan.num_tokens % self.block_size:
            copies = (BlockCopy(src=plan.partial_src, dst=table[shared], num_tokens=plan.num_tokens % self.block_size),)
        self.stats.queries += 1
        self.stats.query_tokens += len(seq.token_ids)
        if plan.num_tokens:
            self.stats.hits += 1
            self.stats.hit_tokens += plan.num_tokens
        self._track()
        return Allocation(num_cached_tokens=plan.num_tokens, copies=copies)

    def commit(self, seq: CacheSequence) -> None:
        """Record that KV for ``seq.token_ids[:seq.num_computed_tokens]`` is written: the strategy may publish the
        full blocks among them for reuse. Called after every step that computed tokens of ``seq``."""
        holding = self._holdings.get(seq.seq_id)
        if holding is None:
            return
        computed = min(seq.num_computed_tokens, len(holding.table) * self.block_size)
        holding.state = self.publish(seq, holding.table, holding.state, computed - computed % self.block_size)
        self._track()

    def free(self, seq: CacheSequence) -> None:
        """Release every block ``seq`` holds (finish, abort or preemption). Idempotent.

        Computed KV stays cached for reuse (as the strategy decides) until evicted; the block table is forgotten.
        """
        holding = self._holdings.pop(seq.seq_id, None)
        if holding is not None:
            computed = min(seq.num_computed_tokens, len(holding.table) * self.block_size)
            self.release(seq, holding.table, holding.state, computed)
            self._track()
        self.forget(seq.seq_id)

    def block_table(self, seq_id: str) -> Seq[int]:
        """The block ids holding ``seq_id``'s KV, in token order (empty when it holds none)."""
        holding = self._holdings.get(seq_id)
        return tuple(holding.table) if holding is not None else ()

    def live_states(self) -> dict[str, Any]:
        """The strategy's state (what :meth:`claim` returned, as :meth:`publish` updated it) of every sequence
        holding blocks; for a strategy's own consistency checks in tests."""
        return {seq_id: holding.state for seq_id, holding in self._holdings.items()}

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

    def _track(self) -> None:
        in_use = self.num_blocks - self.num_free_blocks
        self.stats.blocks_in_use = in_use
        self.stats.peak_blocks_in_use = max(self.stats.peak_blocks_in_use, in_use)

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
        the strategy reuses at token granularity)."""

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
