"""Hook implementations of the prefix_affinity router plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.router import Router
from pydantic import BaseModel

from frame_router_prefix_affinity.router import PrefixAffinityOptions, PrefixAffinityRouter

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    return PrefixAffinityOptions


@hookimpl
def frame_router_create(num_ranks: int, options: BaseModel | None) -> Router:
    """The prefix-affinity router with ``options`` (its defaults without)."""
    return PrefixAffinityRouter(num_ranks, options if isinstance(options, PrefixAffinityOptions) else None)
