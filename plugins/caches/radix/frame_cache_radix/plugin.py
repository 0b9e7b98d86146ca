"""The ``radix`` KV-cache strategy plugin: hooks and options."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.cache import KVCacheStrategy
from pydantic import BaseModel, ConfigDict, Field

from frame_cache_radix.strategy import RadixCache

FRAME_API_VERSION = 2


class RadixOptions(BaseModel):
    """Options of ``--cache radix``: ``--cache-opt key=value``, or ``cache_options:`` in a config file."""

    model_config = ConfigDict(extra="forbid")

    partial_block_reuse: bool = Field(
        True, description="reuse a match that ends inside a block by copying its slots (False: whole blocks only)"
    )


@hookimpl
def frame_plugin_options() -> type[BaseModel] | None:
    return RadixOptions


@hookimpl
def frame_cache_create(num_blocks: int, block_size: int, options: BaseModel | None) -> KVCacheStrategy:
    opts = options if isinstance(options, RadixOptions) else RadixOptions.model_validate(
        options.model_dump() if options is not None else {}
    )
    return RadixCache(num_blocks, block_size, partial_block_reuse=opts.partial_block_reuse)
