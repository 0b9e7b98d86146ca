"""StructuredOutputManager: each constrained request's grammar matcher, and the masks of every step.

Runs in the engine core beside the scheduler. A request with ``structured_outputs`` gets a matcher when it is
added; its grammar comes from the cache (:class:`~frame.engine.core.grammar_cache.GrammarCache`, bounded in bytes),
or was compiled just before in the loop's compile thread (:mod:`frame.engine.core.compile_queue`), or is compiled
then. Before each step the manager writes one
mask row per position the step samples for it (its last token, then every draft it verifies, advancing the
matcher over the drafts and rolling back); after the step it advances the matcher over the tokens emitted, and
keeps only the drafts the grammar allows for the next step. The grammar backend plugin is created on first use.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from frame.engine.core.grammar_cache import GrammarCache, digest
from frame.interfaces.grammar import GrammarBackend, GrammarMatcher, words_for
from frame.sampling_params import StructuredOutputs

if TYPE_CHECKING:
    from frame.engine.wire.plan import RequestSample
    from frame.sequence import Sequence

#: Bytes of compiled grammars kept for reuse by default (``--grammar-cache-bytes``).
CACHE_BYTES = 512 << 20


class StructuredOutputManager:
    """Matchers by request id; ``backend_factory()`` builds the grammar backend the first time one is needed."""

    def __init__(self, backend_factory: Any, vocab_size: int, cache_bytes: int = CACHE_BYTES) -> None:
        self._factory = backend_factory
        self._backend: GrammarBackend | None = None
        self.words = words_for(vocab_size)
        self.cache = GrammarCache(cache_bytes)
        #: Grammars the compile thread finished for requests about to be added (too large for the cache, maybe).
        self._fresh: dict[bytes, Any] = {}
        self._matchers: dict[str, GrammarMatcher] = {}

    @property
    def backend(self) -> GrammarBackend:
        if self._backend is None:
            self._backend = self._factory()
        return self._backend

    def is_ready(self, spec: StructuredOutputs) -> bool:
        """True when ``spec``'s grammar needs no compiling (cached, or just compiled)."""
        key = digest(spec)
        return key in self._fresh or key in self.cache

    def build(self, spec: StructuredOutputs) -> tuple[Any, int, float]:
        """Compile ``spec`` uncached: the grammar, its size in bytes and the seconds it took. Touches no state of
        the manager but the backend's creation, so the loop's compile thread may call it (the backend is created
        by the loop first: see :meth:`prepare`)."""
        started = time.perf_counter()
        compiled = self.backend.compile(spec)
        return compiled, self.backend.memory_bytes(compiled), time.perf_counter() - started

    def prepare(self) -> None:
        """Create the backend now (in the loop thread), before a compile thread uses it."""
        _ = self.backend

    def store(self, spec: StructuredOutputs, built: tuple[Any, int, float]) -> None:
        """Keep a grammar :meth:`build` returned, for the request that asked for it and in the cache."""
        compiled, size, seconds = built
        key = digest(spec)
        self.cache.compile_seconds += seconds
        self.cache.put(key, compiled, size)
        self._fresh[key] = compiled

    def compile(self, spec: StructuredOutputs) -> Any:
        """The compiled grammar of ``spec`` (cached); raises the backend's usage error for a bad constraint."""
        key = digest(spec)
        fresh = self._fresh.pop(key, None)
        if fresh is not None:
            return fresh
        compiled = self.cache.get(key)
        if compiled is None:
            built = self.build(spec)
            self.store(spec, built)
            compiled = self._fresh.pop(key)
        return compiled

    def add(self, req_id: str, spec: StructuredOutputs) -> None:
        self._matchers[req_id] = self.backend.matcher(self.compile(spec))

    def forget(self, req_id: str) -> None:
        self._matchers.pop(req_id, None)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._matchers

    @property
    def active(self) -> bool:
        """True while any request is constrained (steps without one skip the manager entirely)."""
        return bool(self._matchers)

    def masks(self, requests: list[tuple[str, list[int]]]) -> tuple[list[str], list[int], np.ndarray]:
        """Mask rows of the step's sampling ``(request, drafts)`` pairs that are constrained: their ids, their row
        counts (1 + drafts each) and the rows, int32 ``[sum, words]``."""
        ids, counts, blocks = [], [], []
        for req_id, drafts in requests:
            matcher = self._matchers.get(req_id)
            if matcher is None:
                continue
            rows = np.zeros((len(drafts) + 1, self.words), dtype=np.int32)
            matcher.fill_bitmask(rows[0])
            advanced = 0
            for j, token in enumerate(drafts, start=1):
                if not matcher.accept(token):
                    rows[j:] = rows[j - 1]  # unreachable: drafts are checked when kept (see valid_drafts)
                    break
                advanced += 1
                matcher.fill_bitmask(rows[j])
            matcher.rollback(advanced)
            ids.append(req_id)
            counts.append(len(drafts) + 1)
            blocks.append(rows)
        return ids, counts, np.concatenate(blocks) if blocks else np.zeros((0, self.words), dtype=np.int32)

    def accept(self, req_id: str, tokens: list[int]) -> bool:
        """Advance ``req_id``'s matcher over the tokens a step emitted; True once its grammar is complete."""
        matcher = self._matchers.get(req_id)
        if matcher is None:
            return False
        for token in tokens:
            if matcher.is_terminated() or not matcher.accept(token):
                break
        return matcher.is_terminated()

    def follow(self, samples: Iterable[RequestSample], live: Mapping[str, Sequence], done: set[str]) -> list[str]:
        """After a step: advance each constrained request's matcher over the tokens it emitted, and keep only the
        drafts its grammar allows for the next step (``live[id].spec_token_ids``). Returns the ids, outside
        ``done`` (requests a stop rule already ended), whose grammar is now complete: they end there, even when
        ignoring EOS."""
        completed = []
        for sample in samples:
            seq = live.get(sample.req_id)
            if seq is None or sample.req_id not in self._matchers:
                continue
            if self.accept(sample.req_id, sample.token_ids) and sample.req_id not in done:
                completed.append(sample.req_id)
            elif seq.spec_token_ids:
                seq.spec_token_ids = self.valid_drafts(sample.req_id, seq.spec_token_ids)
        return completed

    def valid_drafts(self, req_id: str, drafts: list[int]) -> list[int]:
        """The longest prefix of ``drafts`` the grammar allows from ``req_id``'s state (state unchanged)."""
        matcher = self._matchers.get(req_id)
        if matcher is None or not drafts:
            return drafts
        kept = 0
        for token in drafts:
            if matcher.is_terminated() or not matcher.accept(token):
                break
            kept += 1
        matcher.rollback(kept)
        return drafts[:kept]
