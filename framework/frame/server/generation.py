"""Generation: the prompts of one HTTP request, run through the AsyncEngine as one merged stream.

A completions request may carry several prompts; each becomes its own engine request (``<id>-<p>``) and their
items are merged in arrival order as ``(prompt_index, item)``. Leaving the stream early (a client disconnect)
cancels every prompt's task, which aborts its sequences in the engine. :meth:`collect` is the non-streaming
form; it watches the HTTP connection and aborts when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from frame.engine.client import StreamItem
from frame.engine.client.output_processor import CompletionDelta
from frame.outputs import RequestOutput
from frame.sampling_params import SamplingParams
from frame.server.errors import ClientDisconnectedError, ServerError
from frame.server.formatting import usage_counts
from frame.server.metrics import RequestTimer
from frame.server.state import ServerState

__all__ = ["ClientDisconnectedError", "Generation", "PromptJob"]
_DONE = object()
DISCONNECT_POLL_S = 0.25


@dataclass
class PromptJob:
    """One prompt: its text (None when sent as token ids) and its token ids."""

    text: str | None
    ids: list[int]


class Generation:
    """Runs ``jobs`` with one set of sampling params; ``admit`` first."""

    def __init__(self, state: ServerState, request_id: str, jobs: list[PromptJob], params: SamplingParams,
                 priority: int = 0, cache_salt: str | None = None) -> None:
        self.state, self.request_id, self.jobs, self.params = state, request_id, jobs, params
        self.priority, self.cache_salt = priority, cache_salt
        self.completion_tokens = self.cached_tokens = 0  # counted by deltas(), for a stream's usage chunk
        self._reserved = 0  # waiting-queue places taken by admit() that no prompt task has taken over yet

    def admit(self) -> None:
        """Refuse with 400 a request that could never be queued; with 503 when the engine is not running, the
        server is draining or the waiting queue is full."""
        state, retry = self.state, {"Retry-After": str(self.state.settings.retry_after_s)}
        limit, needed = state.settings.limits.max_waiting_requests, self.params.n * len(self.jobs)
        if needed > limit:
            raise ServerError(f"This request needs {needed} sequences (n={self.params.n} for each of "
                              f"{len(self.jobs)} prompts), more than this server ever queues ({limit}, "
                              "--max-waiting-requests); send fewer prompts or a smaller n.", status=400,
                              code="limit_exceeded", param="n")
        if not state.client.healthy:
            why = state.client.dead_reason or "no engine core is serving"
            raise ServerError(f"The engine is not running ({why}); retry shortly.", status=503, code="engine_dead",
                              headers=retry)
        if state.draining:
            raise ServerError("The server is shutting down; retry on another instance.", status=503,
                              code="server_draining", headers=retry)
        if state.waiting + needed > limit:
            state.metrics.rejected.labels(status="503").inc()
            raise ServerError(f"The server's waiting queue is full ({limit} sequences); retry shortly.",
                              status=503, code="queue_full", headers=retry)
        self._reserved = self.params.n * len(self.jobs)
        state.waiting += self._reserved

    def release(self) -> None:
        """Give back the waiting places no prompt task took over (a stream that never started); idempotent."""
        self.state.waiting -= self._reserved
        self._reserved = 0

    async def _pump(self, p: int, job: PromptJob, out: asyncio.Queue[tuple[int, object]]) -> None:
        timer = RequestTimer(self.state.metrics, len(job.ids))
        waiting = self.params.n
        self._reserved -= waiting  # this task now owns its places
        try:
            async for item in self.state.engine.generate(f"{self.request_id}-{p}", job.text, job.ids, self.params,
                                                         self.priority, self.cache_salt):
                if isinstance(item, CompletionDelta):
                    if waiting:
                        self.state.waiting -= waiting
                        waiting = 0
                    timer.tokens(len(item.token_ids))
                else:
                    timer.finish([c.finish_reason or "abort" for c in item.outputs])
                out.put_nowait((p, item))
            out.put_nowait((p, _DONE))
        except Exception as err:
            out.put_nowait((p, err))
        finally:
            self.state.waiting -= waiting

    async def stream(self) -> AsyncIterator[tuple[int, StreamItem]]:
        """Yield ``(prompt_index, delta or RequestOutput)`` until every prompt has finished."""
        out: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        tasks = [asyncio.create_task(self._pump(p, job, out)) for p, job in enumerate(self.jobs)]
        self.state.metrics.in_flight.inc()
        remaining = len(tasks)
        try:
            while remaining:
                p, item = await out.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield p, item  # type: ignore[misc]
        finally:
            self.state.metrics.in_flight.dec()
            self.release()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def deltas(self) -> AsyncIterator[tuple[int, CompletionDelta]]:
        """The stream's deltas that carry text, logprobs or an end, counting tokens on the way."""
        async for p, item in self.stream():
            if isinstance(item, RequestOutput):
                self.cached_tokens += item.num_cached_tokens
                continue
            self.completion_tokens += len(item.token_ids)
            if item.text or item.finish_reason is not None or item.logprobs is not None:
                yield p, item

    def usage(self, details: bool) -> dict[str, Any]:
        """The usage of what :meth:`deltas` has streamed so far."""
        return usage_counts(sum(len(j.ids) for j in self.jobs), self.completion_tokens, self.cached_tokens, details)

    async def collect(self, request: Request) -> list[RequestOutput]:
        """Run to the end and return one RequestOutput per prompt; abort if the client disconnects."""

        async def consume() -> list[RequestOutput]:
            results: dict[int, RequestOutput] = {}
            async for p, item in self.stream():
                if isinstance(item, RequestOutput):
                    results[p] = item
            return [results[p] for p in range(len(self.jobs))]

        task = asyncio.create_task(consume())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    raise ClientDisconnectedError
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
