"""The values of the KV-cache contract: what the scheduler and a strategy exchange (matches, claims, allocations,
block copies, statistics) and the sequence views a strategy reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

__all__ = [
    "NO_CLAIM",
    "Allocation",
    "BlockCopy",
    "CacheSequence",
    "CacheStats",
    "GroupSequence",
    "PrefixClaim",
    "PrefixMatch",
    "held_from",
    "window_of",
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


class GroupSequence:
    """One KV group's view of a sequence: what the strategy half receives from the core half.

    Group 0 keeps the sequence's ``seq_id`` and ``extra_keys``; every other group adds its number to both, so
    that no digest, tree or memo of one group ever meets another's (their blocks hold other layers' KV).
    ``window``: the group's sliding window (None: full attention); a strategy may then reuse a prefix whose early
    blocks are gone, since only the last ``window`` positions before the reused end are read. ``held_from``: the
    first table position the sequence still holds (a windowed group gives back the blocks before its window);
    set when the core half calls :meth:`KVCacheStrategy.release` or :meth:`KVCacheStrategy.release_blocks`, 0
    otherwise."""

    __slots__ = ("extra_keys", "group", "held_from", "seq", "seq_id", "window")

    def __init__(self, seq: CacheSequence, group: int = 0, window: int | None = None, held_from: int = 0) -> None:
        self.seq, self.group, self.window, self.held_from = seq, group, window, held_from
        self.seq_id = seq.seq_id if group == 0 else f"{seq.seq_id}#kv-group-{group}"
        self.extra_keys = seq.extra_keys if group == 0 else (*seq.extra_keys, f"kv-group-{group}")

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return self.seq.num_prompt_tokens

    @property
    def num_computed_tokens(self) -> int:
        return self.seq.num_computed_tokens


def window_of(seq: CacheSequence) -> int | None:
    """The sliding window of the KV group ``seq`` stands for (None: full attention, or a plain sequence)."""
    return seq.window if isinstance(seq, GroupSequence) else None


def held_from(seq: CacheSequence) -> int:
    """The first block-table position ``seq`` still holds when it is released (0 but for a windowed group)."""
    return seq.held_from if isinstance(seq, GroupSequence) else 0


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
    maximum since the last reset of stats. ``group_blocks_in_use[g]``: the distinct blocks live sequences hold in
    KV group ``g`` (:mod:`frame.interfaces.kv_groups`; one entry for a model with one group), and its peak.
    """

    num_blocks: int = 0
    queries: int = 0
    query_tokens: int = 0
    hits: int = 0
    hit_tokens: int = 0
    evictions: int = 0
    blocks_in_use: int = 0
    peak_blocks_in_use: int = 0
    group_blocks_in_use: list[int] = field(default_factory=list)
    peak_group_blocks_in_use: list[int] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens reused / prompt tokens looked up."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def usage(self) -> float:
        """Fraction of the pool referenced by live sequences."""
        return self.blocks_in_use / self.num_blocks if self.num_blocks else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__}, "hit_rate": self.hit_rate}


@dataclass(frozen=True)
class PrefixClaim:
    """What claiming a prefix match would take, worked out by :meth:`KVCacheStrategy.plan_claim` without side
    effects.

    ``shared_blocks`` are full blocks the sequence will reference as they are: its table entries from position
    ``first_block`` on (0, unless a windowed group claims only the blocks its window reads, the earlier positions
    staying unheld); ``num_tokens`` is the tokens reused: ``(first_block + len(shared_blocks)) * block_size``,
    plus ``num_tokens % block_size`` slots of ``partial_src`` that the runner copies into the sequence's first
    new block (a hit that ends inside a block another sequence owns). ``newly_pinned`` counts blocks that are
    free now (evictable) and stop being free once claimed, so that the core can check capacity first. ``handle``
    is the strategy's, for :meth:`KVCacheStrategy.claim`.
    """

    num_tokens: int = 0
    shared_blocks: tuple[int, ...] = ()
    partial_src: int | None = None
    newly_pinned: int = 0
    handle: Any = None
    first_block: int = 0


NO_CLAIM = PrefixClaim()
