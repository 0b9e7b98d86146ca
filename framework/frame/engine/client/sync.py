"""DataParallelEngine: data-parallel engine cores driven from synchronous code, shaped like an EngineCore.

The offline ``LLM`` and the benchmark driver call ``add_request``, ``step``, ``abort``, ``has_unfinished`` and
``stats`` on an :class:`~frame.engine.core.engine_core.EngineCore`; this class answers the same calls over a
:class:`~frame.engine.client.data_parallel.DataParallelClient` (each core a child process or a Ray actor), running the
client on a private asyncio loop. ``step`` returns whatever the cores produced since the last call, waiting for
at least one output while requests are open; the cores run in parallel meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from frame.config import EngineConfig
from frame.engine.client.base import EngineDeadError
from frame.engine.client.data_parallel import DataParallelClient
from frame.engine.client.dp import make_dp_client
from frame.engine.wire.client_core import Outputs, Rejected
from frame.engine.wire.requests import EngineOutput, EngineRequest, EngineStats, check_request
from frame.errors import FrameUsageError
from frame.model_source import ModelSource

T = TypeVar("T")

#: The longest ``step`` waits for an output before it checks the cores again (seconds).
WAIT_S = 1.0


def _close(loop: asyncio.AbstractEventLoop, client: DataParallelClient) -> None:
    if loop.is_closed():
        return
    loop.run_until_complete(client.shutdown())
    # Reader and watchdog tasks the clients cancelled have not run their cancellation yet; closing the loop under
    # them printed "Task was destroyed but it is pending!" once per task.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


class DataParallelEngine:
    """``config.data_parallel_size`` engine cores behind the calls of one EngineCore."""

    def __init__(self, config: EngineConfig, source: ModelSource | None = None) -> None:
        self.config = config
        self.source = source or ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
        self._loop = asyncio.new_event_loop()
        self.client = make_dp_client(config)
        self.client.listener = self._on_message
        self.client.on_lost = self._on_lost
        self._outputs: list[EngineOutput] = []
        self._pending: list[EngineRequest] = []
        self._open: set[str] = set()
        self._failure: BaseException | None = None
        self._arrived: asyncio.Event | None = None
        try:
            info = self._run(self.client.start())
        except BaseException:
            _close(self._loop, self.client)
            raise
        self._finalizer = weakref.finalize(self, _close, self._loop, self.client)
        self.max_model_len = info.max_model_len
        self.max_speculative_tokens = info.max_speculative_tokens
        self.num_blocks = info.num_blocks

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self._loop.run_until_complete(coro)

    def _call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run inside the private loop: what it sends (ZeroMQ's asyncio sockets make a future per send)
        belongs to that loop, whatever loop this thread had or lost before (an earlier ``asyncio.run``)."""

        async def call() -> T:
            return fn()

        return self._run(call())

    @property
    def num_ranks(self) -> int:
        return self.config.data_parallel_size

    # -- the EngineCore calls ---------------------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> None:
        """Queue a sequence; it is routed and sent at the next ``step`` (with the other sequences of its prompt)."""
        check_request(req, self.max_model_len, self.max_speculative_tokens)
        if req.request_id in self._open:
            raise ValueError(f"request id {req.request_id} is already running")
        self._pending.append(req)
        self._open.add(req.request_id)

    def has_unfinished(self) -> bool:
        return bool(self._open)

    def step(self) -> list[EngineOutput]:
        """What the cores produced since the last call (waiting for something while requests are open)."""
        self._flush()
        if not self._outputs and self._open and self._failure is None:
            self._run(self._wait())
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        outputs, self._outputs = self._outputs, []
        for out in outputs:
            if out.finished:
                self._open.discard(out.request_id)
        return outputs

    def abort(self, request_ids: list[str]) -> list[EngineOutput]:
        """Abort sequences; queued ones end now (returned), sent ones end with their core's next output."""
        queued = [r for r in self._pending if r.request_id in set(request_ids)]
        self._pending = [r for r in self._pending if r not in queued]
        self._open.difference_update(r.request_id for r in queued)
        sent = [rid for rid in request_ids if rid not in {r.request_id for r in queued}]
        self._call(lambda: self.client.abort(sent))
        return [EngineOutput(request_id=r.request_id, new_token_ids=[], finish_reason="abort",
                             num_prompt_tokens=len(r.prompt_token_ids)) for r in queued]

    def stats(self) -> EngineStats:
        """Every serving core's stats, summed."""
        return self._run(self.client.stats())

    def stats_by_rank(self) -> dict[int, EngineStats]:
        return self._run(self.client.rank_stats())

    def routed(self) -> list[int]:
        """How many prompts the router sent to each rank so far."""
        return [slot.routed for slot in self.client.slots]

    def reset_prefix_cache(self) -> bool:
        """Drop every core's cached prefixes (each core ignores it while it holds requests)."""
        if self._open:
            return False
        self._call(self.client.reset_prefix_cache)
        return True

    def shutdown(self) -> None:
        self._finalizer()

    # -- internals --------------------------------------------------------------------------------------
    def _flush(self) -> None:
        """Send the queued sequences, the sequences of one prompt (consecutive, same prompt and parent id) as one
        routing decision."""
        groups: list[list[EngineRequest]] = []
        for req in self._pending:
            last = groups[-1][-1] if groups else None
            if (last is not None and last.prompt_token_ids == req.prompt_token_ids
                    and last.request_id.rsplit("-", 1)[0] == req.request_id.rsplit("-", 1)[0]):
                groups[-1].append(req)
            else:
                groups.append([req])
        self._pending = []
        for group in groups:
            try:
                self._call(lambda group=group: self.client.add(group))
            except BaseException:
                self._open.difference_update(r.request_id for r in group)
                raise

    async def _wait(self) -> None:
        self._arrived = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), WAIT_S)

    def _wake(self) -> None:
        if self._arrived is not None:
            self._arrived.set()

    def _on_message(self, msg: Outputs | Rejected) -> None:
        if isinstance(msg, Rejected):
            self._open.discard(msg.request_id)
            self._failure = FrameUsageError(msg.message, param=msg.param)
        else:
            self._outputs.extend(msg.outputs)
        self._wake()

    def _on_lost(self, sequence_ids: list[str], reason: str) -> None:
        self._open.difference_update(sequence_ids)
        self._failure = EngineDeadError(f"{len(sequence_ids)} sequences could not finish: {reason}")
        self._wake()
