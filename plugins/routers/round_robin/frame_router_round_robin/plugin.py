"""Hook implementations of the round_robin router plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.router import Router
from pydantic import BaseModel

from frame_router_round_robin.router import RoundRobinRouter

FRAME_API_VERSION = 2


@hookimpl
def frame_router_create(num_ranks: int, options: BaseModel | None) -> Router:
    """The round-robin router (it takes no options)."""
    return RoundRobinRouter(num_ranks)
