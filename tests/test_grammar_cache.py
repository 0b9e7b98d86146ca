"""The engine's compiled-grammar cache (bounded in bytes) and its compile queue (grammars compiled off the loop)."""

from __future__ import annotations

import time

from frame.engine.core.compile_queue import CompileQueue
from frame.engine.core.grammar_cache import GrammarCache
from frame.engine.core.structured import StructuredOutputManager
from frame.engine.wire.requests import EngineRequest
from frame.errors import InvalidSamplingError
from frame.model_source import ModelSource
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.sampling_params import SamplingParams, StructuredOutputs

VOCAB = 49152


def test_the_cache_stays_within_its_bytes_evicting_the_least_recently_used():
    cache = GrammarCache(max_bytes=100)
    for key in (b"a", b"b", b"c"):
        cache.put(key, key.decode(), 40)
    assert cache.bytes == 80 and len(cache) == 2 and cache.evictions == 1 and b"a" not in cache
    assert cache.get(b"b") == "b"  # b is now the most recent: c goes next
    cache.put(b"d", "d", 40)
    assert b"c" not in cache and b"b" in cache and cache.bytes == 80
    cache.put(b"huge", "huge", 101)  # larger than the bound: used once, never kept
    assert b"huge" not in cache and cache.bytes == 80 and cache.evictions == 3


def _manager(cache_bytes: int) -> StructuredOutputManager:
    tokenizer = ModelSource.open(None).tokenizer

    def factory():
        hooks = PluginHooks(PluginRegistry())
        hooks.registry.load("grammar", "xgrammar")
        return hooks.create_grammar_backend("xgrammar", tokenizer, VOCAB, [2], None)

    return StructuredOutputManager(factory, VOCAB, cache_bytes)


def _request(req_id: str, spec: StructuredOutputs) -> EngineRequest:
    return EngineRequest(request_id=req_id, prompt_token_ids=[1], arrival_time=0.0,
                         params=SamplingParams(structured_outputs=spec))


def _wait(queue: CompileQueue, timeout_s: float = 60.0) -> list:
    deadline = time.monotonic() + timeout_s
    while not (done := queue.ready()):
        assert time.monotonic() < deadline, "the grammar did not compile"
        time.sleep(0.01)
    return done


def test_the_queue_compiles_in_its_thread_and_the_manager_keeps_within_its_bound():
    manager = _manager(cache_bytes=1 << 20)
    queue = CompileQueue(manager)
    sizes = []
    for i in range(6):
        spec = StructuredOutputs(regex="|".join(f"v{i}w{j}x" for j in range(3000)))
        req = _request(f"r{i}", spec)
        assert queue.needs(req)
        queue.submit(req)
        [(ready, error)] = _wait(queue)
        assert ready is req and error is None and manager.is_ready(spec)
        manager.add(req.request_id, spec)  # the hand-off: no second compile
        manager.forget(req.request_id)
        sizes.append(manager.cache.bytes)
        assert manager.cache.bytes <= 1 << 20
    assert manager.cache.compile_seconds > 0 and max(sizes) > 0
    assert manager.cache.evictions > 0, sizes  # six 3,000-branch regexes (about 250 KB each) pass 1 MiB


def test_a_constraint_that_fails_to_compile_comes_back_with_its_error_and_an_aborted_one_is_dropped():
    queue = CompileQueue(_manager(cache_bytes=1 << 20))
    bad = _request("bad", StructuredOutputs(regex="("))
    gone = _request("gone", StructuredOutputs(regex="abc|abd"))
    queue.submit(bad)
    queue.submit(gone)
    assert queue.cancel(["gone", "unknown"]) == ["gone"]
    [(req, error)] = _wait(queue)
    assert req is bad and isinstance(error, InvalidSamplingError)
    assert len(queue) == 0
