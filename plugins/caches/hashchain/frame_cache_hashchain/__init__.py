"""frame-cache-hashchain: vLLM-style prefix caching, full blocks keyed by a chained sha256 digest."""

from frame_cache_hashchain.strategy import HashChainCache

__all__ = ["HashChainCache"]
