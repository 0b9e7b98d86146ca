"""KVCacheStrategy: bookkeeping over block ids that decides which KV blocks a sequence uses and reuses.

The KV pool is paged in every strategy: ``num_blocks`` blocks of ``block_size`` token slots each, slot
``block_id * block_size + offset``. A strategy owns the mapping from sequences to blocks (their block tables),
reference counts of shared blocks, what is cached for reuse and what is evicted. It never touches tensors: when
reuse needs KV moved (a partial block copied for a token-granular hit), it returns :class:`BlockCopy` orders
and the model runner performs them before the step's forward.

Strategies see sequences through :class:`CacheSequence` (``frame.sequence.Sequence`` satisfies it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


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
class BlockCopy:
    """An order to the runner: copy the KV of slots ``[0, num_tokens)`` of ``src`` into ``dst`` (all layers)."""

    src: int
    dst: int
    num_tokens: int


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


class KVCacheStrategy(ABC):
    """Allocates, shares, caches and evicts the KV blocks of a paged pool.

    The scheduler drives it: :meth:`match` then :meth:`allocate` when admitting a sequence, :meth:`allocate`
    again before each step that adds tokens, :meth:`commit` after the step wrote KV, :meth:`free` when the
    sequence finishes, aborts or is preempted. Every method is called from the engine core's single thread.
    """

    reuses_prefixes: ClassVar[bool] = True
    """False for a strategy whose :meth:`match` is always empty; schedulers then never wait for a prefix."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV pool needs at least one block of one slot, got {num_blocks}x{block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.stats = CacheStats(num_blocks=num_blocks)

    @abstractmethod
    def match(self, seq: CacheSequence) -> PrefixMatch:
        """Find the longest reusable prefix of ``seq.token_ids`` (honouring ``seq.extra_keys``). No side effects.

        Called by the scheduler for a sequence that holds no blocks (before admitting it), and by cache-aware
        schedulers to rank waiting sequences. Returns at most ``len(seq.token_ids) - 1`` tokens.
        """

    @abstractmethod
    def allocate(
        self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None = None
    ) -> Allocation | None:
        """Make room for ``num_new_tokens`` more tokens of ``seq`` and return the allocation, or None.

        On a sequence that holds no blocks, ``match`` (from :meth:`match`, just before) is claimed first: its
        blocks are referenced (or copied) and ``Allocation.num_cached_tokens`` says how many tokens they cover;
        the new tokens then follow them. Capacity is ensured for
        ``seq.num_computed_tokens + num_cached_tokens + num_new_tokens`` tokens, evicting unreferenced cached
        blocks least-recently-used first if needed. Returns None, with no side effects at all, when the pool
        cannot provide that many blocks.
        """

    @abstractmethod
    def commit(self, seq: CacheSequence) -> None:
        """Record that KV for ``seq.token_ids[:seq.num_computed_tokens]`` is written; make it reusable.

        Called after every step that computed tokens of ``seq``. A strategy may publish only full blocks here
        and the rest at :meth:`free`.
        """

    @abstractmethod
    def free(self, seq: CacheSequence) -> None:
        """Release every block ``seq`` holds (finish, abort or preemption). Idempotent.

        Computed KV stays cached for reuse until evicted; the sequence's block table is forgotten.
        """

    @abstractmethod
    def block_table(self, seq_id: str) -> Seq[int]:
        """The block ids holding ``seq_id``'s KV, in token order (empty when it holds none)."""

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks an allocation could obtain now: never used, or cached but unreferenced (evictable)."""

    @abstractmethod
    def reset(self) -> bool:
        """Drop every cached, unreferenced block. Returns False (changing nothing) while any block is in use."""

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def track_usage(self, blocks_in_use: int) -> None:
        self.stats.blocks_in_use = blocks_in_use
        self.stats.peak_blocks_in_use = max(self.stats.peak_blocks_in_use, blocks_in_use)
