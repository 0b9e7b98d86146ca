"""RoundRobinRouter: the live ranks take requests in turn."""

from __future__ import annotations

from collections.abc import Sequence

from frame.interfaces.router import RankLoad, Router, RouteRequest


class RoundRobinRouter(Router):
    """Each request goes to the first live rank after the previous request's rank, wrapping around; a rank that
    is missing (dead) is skipped, and one that comes back takes its turn again."""

    def __init__(self, num_ranks: int) -> None:
        super().__init__(num_ranks)
        self._last = -1

    def route(self, request: RouteRequest, ranks: Sequence[RankLoad]) -> int:
        """The next live rank in turn."""
        chosen = next((load.rank for load in ranks if load.rank > self._last), ranks[0].rank)
        self._last = chosen
        return chosen
