"""Hooks of data-parallel router plugins (entry-point group ``frame.routers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.router import Router


@hookspec
def frame_router_create(num_ranks: int, block_size: int, options: BaseModel | None) -> Router:
    """Create the router that places each request on one of ``num_ranks`` data-parallel engine cores.

    Called once, on the selected plugin (``--router``), by whatever runs the cores (the API server with
    ``--data-parallel-size N``, or the offline ``LLM``) before the first request. ``block_size`` is the cores' KV
    block size in tokens, the size of the blocks whose digests a request carries when the router sets
    ``uses_prefix_digests``; ``options`` is the plugin's options instance (``--router-opt``) or None. Since API 2.
    """
