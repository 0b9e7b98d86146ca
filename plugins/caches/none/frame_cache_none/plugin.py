"""The ``none`` KV-cache strategy plugin: paged allocation with no prefix reuse."""

from __future__ import annotations

from typing import TYPE_CHECKING

from frame.hookspecs import hookimpl
from frame.interfaces.cache import KVCacheStrategy

from frame_cache_none.strategy import NoCache

if TYPE_CHECKING:
    from pydantic import BaseModel

FRAME_API_VERSION = 2


@hookimpl
def frame_cache_create(num_blocks: int, block_size: int, options: BaseModel | None) -> KVCacheStrategy:
    return NoCache(num_blocks, block_size)
