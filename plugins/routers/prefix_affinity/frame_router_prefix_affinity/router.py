"""PrefixAffinityRouter: a request follows its prompt's prefix to the core that already holds it, within a load
bound.

SGLang's cache-aware router is the model: the router cannot see the cores' caches, so it remembers what it sent
where (an approximation of each core's cache, bounded and least-recently-used like the cache itself) and sends a
request to the core that would already hold most of its prompt. Here the memory holds block digests, not text:
digest ``i`` of a prompt stands for its first ``i + 1`` blocks (a chain, as the hashchain cache keys blocks), so
how much of a prompt a core holds is how many leading digests of the prompt it remembers, found in one walk.

Three rules, in order:

1. **Load bound.** A core more than ``balance_abs`` requests above the least-loaded live core, and above
   ``balance_rel`` times its load, is too busy to follow a prefix to. A hot prefix therefore fills its core only
   up to that bound; the rest spill to the least-loaded core, which then remembers (and caches) the prefix too.
2. **Affinity.** Among the cores within the bound, the one remembering the longest leading run of the prompt's
   blocks takes it, when that run is at least ``match_threshold`` of the prompt's digested blocks (ties: fewer
   requests, fewer tokens, lower rank).
3. **Room.** Otherwise (a new prefix, or one shared too little to matter) the core within the bound that
   remembers the fewest blocks, the one with most room in its cache, takes it; ties go to the less loaded, then
   in turn.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from frame.interfaces.router import RankLoad, Router, RouteRequest
from pydantic import BaseModel, ConfigDict, Field


class PrefixAffinityOptions(BaseModel):
    """Options of the ``prefix_affinity`` router (``--router-opt match_threshold=0.3``)."""

    model_config = ConfigDict(extra="forbid")

    match_threshold: float = Field(
        0.5, ge=0.0, le=1.0, description="share of a prompt's digested blocks a core must already hold for the "
        "request to follow them there")
    balance_abs: int = Field(
        8, ge=0, description="requests a core may hold above the least-loaded live core before it is too busy to "
        "follow a prefix to (together with balance_rel)")
    balance_rel: float = Field(
        1.5, ge=1.0, description="and the multiple of the least-loaded core's requests it must also exceed")
    max_blocks_per_rank: int = Field(
        1 << 16, ge=1, description="block digests remembered per core, least recently routed forgotten first "
        "(about the blocks of one core's KV pool)")


class PrefixAffinityRouter(Router):
    """Cache-aware routing over block digests, with a load bound (see the module docstring)."""

    uses_prefix_digests = True

    def __init__(self, num_ranks: int, options: PrefixAffinityOptions | None = None) -> None:
        super().__init__(num_ranks)
        self.options = options or PrefixAffinityOptions()
        #: Per rank: the digests routed to it, least recently routed first.
        self._seen: list[OrderedDict[bytes, None]] = [OrderedDict() for _ in range(num_ranks)]
        self._last = -1

    def remembered(self, rank: int) -> int:
        """How many block digests the router remembers for ``rank``."""
        return len(self._seen[rank])

    def matched_blocks(self, digests: Sequence[bytes], rank: int) -> int:
        """How many leading blocks of a prompt (by its digests) ``rank`` is remembered to hold."""
        seen = self._seen[rank]
        count = 0
        for digest in digests:
            if digest not in seen:
                break
            count += 1
        return count

    def _too_busy(self, load: RankLoad, least: int) -> bool:
        o = self.options
        return load.num_requests - least > o.balance_abs and load.num_requests > least * o.balance_rel

    def route(self, request: RouteRequest, ranks: Sequence[RankLoad]) -> int:
        """Affinity within the load bound, else the core with most room (see the module docstring)."""
        least = min(load.num_requests for load in ranks)
        eligible = [load for load in ranks if not self._too_busy(load, least)]  # the least loaded always is
        digests = request.block_digests
        chosen = None
        if digests:
            matched = {load.rank: self.matched_blocks(digests, load.rank) for load in eligible}
            best = min(eligible, key=lambda load: (-matched[load.rank], load.num_requests, load.num_tokens,
                                                   load.rank))
            if matched[best.rank] and matched[best.rank] >= self.options.match_threshold * len(digests):
                chosen = best.rank
        if chosen is None:
            room = min((len(self._seen[load.rank]), load.num_requests, load.num_tokens) for load in eligible)
            tied = [load.rank for load in eligible
                    if (len(self._seen[load.rank]), load.num_requests, load.num_tokens) == room]
            chosen = next((rank for rank in tied if rank > self._last), tied[0])
        self._last = chosen
        self._remember(chosen, digests)
        return chosen

    def _remember(self, rank: int, digests: Sequence[bytes]) -> None:
        seen = self._seen[rank]
        # Last block first, so a prompt's first blocks are the most recently used: a full memory forgets a chain
        # from its tail, as the cache itself evicts, and never loses the root that the rest hang from.
        for digest in reversed(digests):
            seen[digest] = None
            seen.move_to_end(digest)
        while len(seen) > self.options.max_blocks_per_rank:
            seen.popitem(last=False)

    def rank_reset(self, rank: int) -> None:
        """The core restarted with an empty cache: forget what was routed to it."""
        self._seen[rank].clear()
