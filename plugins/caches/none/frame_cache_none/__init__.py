"""frame-cache-none: a paged KV allocator with no prefix reuse (the control arm of experiments)."""

from frame_cache_none.strategy import NoCache

__all__ = ["NoCache"]
