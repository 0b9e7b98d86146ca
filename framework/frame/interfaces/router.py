"""Router: which data-parallel engine core serves a request, when several cores sit behind one API server.

With ``data_parallel_size`` N, the server (or the offline ``LLM``) runs N engine cores, each with its own
scheduler, KV-cache strategy and KV pool. For every request the core asks the router plugin (``--router``) for a
rank, giving it what it knows: the request's size, the digests of its prompt's first blocks, and the load each
live core last reported plus what was sent to it since. A router keeps only its own bookkeeping (which prefixes
went where, whose turn it is); it never sees a core, a tensor or a socket, so it is tested without a model.

The digests are a chain, as the ``hashchain`` cache keys blocks: digest ``i`` covers the salt and every token of
blocks ``0..i``, so two prompts share digest ``i`` exactly when they share their first ``i + 1`` blocks (and
cache salt). :func:`block_digests` computes them; the core calls it only for routers that ask
(:attr:`Router.uses_prefix_digests`).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

#: The most leading blocks the core digests for a router (a longer prompt's later blocks are not looked at).
MAX_ROUTED_BLOCKS = 256


def block_digests(token_ids: Sequence[int], block_size: int, salt: str | None = None,
                  max_blocks: int = MAX_ROUTED_BLOCKS) -> tuple[bytes, ...]:
    """sha256 digests of the prompt's leading full blocks, chained: ``d[i] = sha256(d[i-1] || tokens of block
    i)``, ``d[-1]`` being the digest of the cache salt (empty without one). A partial last block has none."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    count = min(len(token_ids) // block_size, max_blocks)
    parent = hashlib.sha256(b"frame-route\0" + (salt or "").encode()).digest()
    out = []
    for i in range(count):
        block = array("q", token_ids[i * block_size:(i + 1) * block_size]).tobytes()
        parent = hashlib.sha256(parent + block).digest()
        out.append(parent)
    return tuple(out)


@dataclass(frozen=True)
class RankLoad:
    """What one live engine core has outstanding: requests it holds (running or waiting) and tokens still to
    compute for them (prompt tokens not yet prefilled plus output tokens still allowed), as the core last
    reported, plus the requests sent to it since that report (counted with their full prompt and
    ``max_tokens``)."""

    rank: int
    num_requests: int = 0
    num_tokens: int = 0

    def __post_init__(self) -> None:
        if self.rank < 0 or self.num_requests < 0 or self.num_tokens < 0:
            raise ValueError(f"a rank's load cannot be negative: {self}")


@dataclass(frozen=True)
class RouteRequest:
    """One request to place. ``block_digests`` holds the digests of its prompt's leading full blocks (see
    :func:`block_digests`) when the router's ``uses_prefix_digests`` is set, else it is empty. A request with
    ``n`` completions is routed once: all its sequences go to the same core (they share the prompt)."""

    request_id: str
    num_prompt_tokens: int
    max_new_tokens: int
    block_digests: tuple[bytes, ...] = field(default=(), repr=False)


class Router(ABC):
    """Chooses a data-parallel rank per request. Called from one thread (the server's event loop), never
    concurrently; every call must be fast (microseconds), since each request waits for it."""

    #: Set to True when :meth:`route` reads ``request.block_digests``; otherwise the core skips computing them.
    uses_prefix_digests: bool = False

    def __init__(self, num_ranks: int) -> None:
        if num_ranks < 1:
            raise ValueError(f"a router needs at least one rank, got {num_ranks}")
        self.num_ranks = num_ranks

    @abstractmethod
    def route(self, request: RouteRequest, ranks: Sequence[RankLoad]) -> int:
        """The rank that serves ``request``: one of ``ranks[i].rank``.

        ``ranks`` holds the live cores only (a dead or restarting one is left out), in ascending rank order, and
        is never empty. The router may record the choice (a prefix router remembers which prefixes each rank now
        holds); it must not raise for any such input. Returning a rank that is not in ``ranks`` is a bug the core
        refuses with an error naming the router.
        """

    def rank_reset(self, rank: int) -> None:  # noqa: B027 - optional hook
        """The engine core of ``rank`` died or was restarted: its KV cache is empty, so forget what was routed to
        it (its load is reported afresh). The default does nothing (a router that keeps no per-rank memory)."""
