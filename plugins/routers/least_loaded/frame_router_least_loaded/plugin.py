"""Hook implementations of the least_loaded router plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.router import Router
from pydantic import BaseModel

from frame_router_least_loaded.router import LeastLoadedOptions, LeastLoadedRouter

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    return LeastLoadedOptions


@hookimpl
def frame_router_create(num_ranks: int, options: BaseModel | None) -> Router:
    """The least-loaded router, comparing what ``options.by`` says first."""
    return LeastLoadedRouter(num_ranks, options if isinstance(options, LeastLoadedOptions) else None)
