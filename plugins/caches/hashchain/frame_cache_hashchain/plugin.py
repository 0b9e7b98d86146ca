"""The ``hashchain`` KV-cache strategy plugin: hooks and options."""

from __future__ import annotations

from typing import Literal

from frame.hookspecs import hookimpl
from frame.interfaces.cache import KVCacheStrategy
from pydantic import BaseModel, ConfigDict, Field

from frame_cache_hashchain.digest import make_block_digest
from frame_cache_hashchain.strategy import HashChainCache

FRAME_API_VERSION = 2


class HashChainOptions(BaseModel):
    """Options of ``--cache hashchain``: ``--cache-opt key=value``, or ``cache_options:`` in a config file."""

    model_config = ConfigDict(extra="forbid")

    hash_algorithm: Literal["sha256", "sha384", "sha512", "blake2b", "sha3_256"] = Field(
        "sha256", description="hashlib algorithm of the block digests (sha256 or stronger)"
    )


@hookimpl
def frame_plugin_options() -> type[BaseModel] | None:
    return HashChainOptions


@hookimpl
def frame_cache_create(num_blocks: int, block_size: int, options: BaseModel | None) -> KVCacheStrategy:
    opts = options if isinstance(options, HashChainOptions) else HashChainOptions.model_validate(
        options.model_dump() if options is not None else {}
    )
    return HashChainCache(num_blocks, block_size, digest=make_block_digest(opts.hash_algorithm))
