"""GrammarCache: compiled grammars by the digest of their constraint, least recently used first out, bounded in bytes.

A compiled grammar holds the vocabulary's mask tables for every state of its automaton: a 20,000-branch regex
keeps tens of megabytes, and each distinct constraint a client sends is a new one. So the cache counts the bytes
the grammar backend reports for each (:meth:`GrammarBackend.memory_bytes`) and evicts the least recently used
entries while the total is over ``max_bytes``; a grammar larger than the whole bound is used by its request and not
kept. ``max_entries`` bounds backends that report no sizes. The counters feed ``/metrics``
(``frame_grammar_cache_*``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from frame.sampling_params import StructuredOutputs

#: Entries kept whatever their size (a backend that reports 0 bytes is bounded by count alone).
MAX_ENTRIES = 256


def digest(spec: StructuredOutputs) -> bytes:
    """The cache key of a constraint: a SHA-256 of its canonical text (a 1 MB choice list is not kept twice)."""
    return hashlib.sha256(spec.key().encode()).digest()


class GrammarCache:
    """An LRU of compiled grammars with a byte bound; not thread-safe (the engine loop alone uses it)."""

    def __init__(self, max_bytes: int, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._items: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        self.compile_seconds = 0.0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: bytes) -> bool:
        return key in self._items

    def get(self, key: bytes) -> Any | None:
        """The compiled grammar under ``key`` (now the most recently used), or None."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: bytes, compiled: Any, size: int) -> None:
        """Keep ``compiled`` (``size`` bytes), evicting the least recently used entries past the bounds."""
        if key in self._items:
            self.bytes -= self._items.pop(key)[1]
        if size > self.max_bytes:
            self.evictions += 1  # used once, never kept
            return
        self._items[key] = (compiled, size)
        self.bytes += size
        while self.bytes > self.max_bytes or len(self._items) > self.max_entries:
            _, (_, gone) = self._items.popitem(last=False)
            self.bytes -= gone
            self.evictions += 1
