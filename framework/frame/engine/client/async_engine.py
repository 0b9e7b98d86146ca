"""AsyncEngine: requests in, streams of text deltas out, over any EngineClient.

It owns the :class:`OutputProcessor` (fan-out of ``n``, incremental detokenisation, stop strings), so the engine
core only schedules and runs the model. Each request gets a queue; :meth:`generate` yields its
:class:`CompletionDelta` items and finally its :class:`RequestOutput`. Leaving the iterator early (a client that
disconnected) aborts the request in the engine, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from frame.engine.client.base import EngineClient, EngineDeadError
from frame.engine.client.output_processor import CompletionDelta, OutputProcessor
from frame.engine.wire.client_core import Outputs, Rejected
from frame.errors import FrameUsageError
from frame.outputs import RequestOutput
from frame.sampling_params import SamplingParams

StreamItem = CompletionDelta | RequestOutput


class EngineRejectedError(FrameUsageError):
    """The engine core refused a request that passed the server's checks."""

    def __init__(self, msg: Rejected) -> None:
        super().__init__(msg.message, param=msg.param)
        self.status, self.code = msg.status, msg.code


class AsyncEngine:
    """Routes one EngineClient's outputs to per-request async streams."""

    def __init__(self, client: EngineClient, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self.client = client
        self.processor = OutputProcessor(tokenizer)
        self._queues: dict[str, asyncio.Queue[StreamItem | BaseException]] = {}
        #: Set once the engine has died (a supervisor waits on it).
        self.died = asyncio.Event()
        client.listener = self._on_message
        client.on_dead = self._on_dead
        client.on_lost = self._on_lost

    @property
    def num_open(self) -> int:
        """Requests whose streams have not finished."""
        return len(self._queues)

    async def generate(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                       params: SamplingParams, priority: int = 0,
                       cache_salt: str | None = None) -> AsyncIterator[StreamItem]:
        """Submit a request and yield its deltas, then its RequestOutput. Raises EngineDeadError if the engine dies."""
        if self.client.dead_reason is not None:
            raise EngineDeadError(self.client.dead_reason)
        queue: asyncio.Queue[StreamItem | BaseException] = asyncio.Queue()
        requests = self.processor.add(request_id, prompt, prompt_token_ids, params, time.monotonic(), priority,
                                      cache_salt)
        self._queues[request_id] = queue
        try:
            self.client.add(requests)
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, RequestOutput):
                    return
        finally:
            if request_id in self._queues:  # left early: disconnect, error, cancellation
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort every sequence of a request and forget it."""
        self.client.abort(self.processor.child_ids(request_id))
        self.processor.drop(request_id)
        self._queues.pop(request_id, None)

    def _on_message(self, msg: Outputs | Rejected) -> None:
        if isinstance(msg, Rejected):
            request_id = msg.request_id.rsplit("-", 1)[0]
            queue = self._queues.get(request_id)
            if queue is not None:
                self.abort(request_id)
                queue.put_nowait(EngineRejectedError(msg))
            return
        processed = self.processor.process(msg.outputs)
        if processed.to_abort:
            self.client.abort(processed.to_abort)
        for delta in processed.deltas:
            queue = self._queues.get(delta.request_id)
            if queue is not None:
                queue.put_nowait(delta)
        for result in processed.finished:
            queue = self._queues.pop(result.request_id, None)
            if queue is not None:
                queue.put_nowait(result)

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """End every open request: its stream raises ``error()``; its sequences are aborted in the engine."""
        for request_id, queue in list(self._queues.items()):
            self.abort(request_id)
            queue.put_nowait(error())

    def _on_lost(self, sequence_ids: list[str], reason: str) -> None:
        """Sequences one of several engine cores held when it died: their requests end with ``reason``."""
        for request_id in dict.fromkeys(sid.rsplit("-", 1)[0] for sid in sequence_ids):
            queue = self._queues.pop(request_id, None)
            if queue is not None:
                self.client.abort(self.processor.child_ids(request_id))  # children a live core still holds
                self.processor.drop(request_id)
                queue.put_nowait(EngineDeadError(f"the request could not finish: {reason}"))

    def _on_dead(self, reason: str) -> None:
        for request_id, queue in list(self._queues.items()):
            self.processor.drop(request_id)
            queue.put_nowait(EngineDeadError(f"the request could not finish: {reason}"))
        self._queues.clear()
        self.died.set()
