"""frame-cache-radix: SGLang-style token-granular prefix caching in a radix tree over a paged pool."""

from frame_cache_radix.strategy import RadixCache

__all__ = ["RadixCache"]
