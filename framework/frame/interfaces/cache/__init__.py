"""The KV-cache strategy contract: :class:`KVCacheStrategy` (:mod:`.strategy`) and the values it exchanges
(:mod:`.values`)."""

from frame.interfaces.cache import values
from frame.interfaces.cache.strategy import KVCacheStrategy
from frame.interfaces.cache.values import *  # noqa: F403 - the contract's values, re-exported as one module

__all__ = [*values.__all__, "KVCacheStrategy"]
