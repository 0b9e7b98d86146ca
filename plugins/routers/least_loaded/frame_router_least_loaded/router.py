"""LeastLoadedRouter: each request goes to the live rank with the least outstanding work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from frame.interfaces.router import RankLoad, Router, RouteRequest
from pydantic import BaseModel, ConfigDict, Field


class LeastLoadedOptions(BaseModel):
    """Options of the ``least_loaded`` router (``--router-opt by=requests``)."""

    model_config = ConfigDict(extra="forbid")

    by: Literal["tokens", "requests"] = Field(
        "tokens", description="compare outstanding tokens first (then requests), or requests first (then tokens)")


class LeastLoadedRouter(Router):
    """The live rank with the smallest load, compared as ``(tokens, requests)`` or ``(requests, tokens)``. Among
    ranks that tie, the first after the previous choice, so idle ranks take sequential traffic in turn."""

    def __init__(self, num_ranks: int, options: LeastLoadedOptions | None = None) -> None:
        super().__init__(num_ranks)
        self.by = (options or LeastLoadedOptions()).by
        self._last = -1

    def _key(self, load: RankLoad) -> tuple[int, int]:
        if self.by == "tokens":
            return load.num_tokens, load.num_requests
        return load.num_requests, load.num_tokens

    def route(self, request: RouteRequest, ranks: Sequence[RankLoad]) -> int:
        """The least-loaded live rank; ties go in turn."""
        least = min(self._key(load) for load in ranks)
        tied = [load.rank for load in ranks if self._key(load) == least]
        chosen = next((rank for rank in tied if rank > self._last), tied[0])
        self._last = chosen
        return chosen
