"""Hooks of KV-cache strategy plugins (entry-point group ``frame.caches``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.cache import KVCacheStrategy


@hookspec
def frame_cache_create(num_blocks: int, block_size: int, options: BaseModel | None) -> KVCacheStrategy:
    """Create the strategy that manages a pool of ``num_blocks`` blocks of ``block_size`` token slots.

    Called once by the engine core, on the selected plugin, after the runner sized the pool and before the
    scheduler is created. Since API 1.
    """
