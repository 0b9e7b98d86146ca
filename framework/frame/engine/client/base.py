"""EngineClient: one async interface to an engine core, whether it runs in a child process or a thread.

The client sends :mod:`messages` to the core's loop and dispatches what comes back: ``Ready`` completes
:meth:`start`, ``StatsReply`` answers :meth:`stats`, ``Outputs`` and ``Rejected`` go to ``listener`` (the
:class:`~frame.engine.client.async_engine.AsyncEngine`), and the engine's death (a ``Failed`` message, a process
that exits, a thread that raises) marks the client dead and calls ``on_dead`` once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from frame.engine.wire.client_core import (
    AbortRequests,
    AddRequests,
    Failed,
    FromEngine,
    GetStats,
    Outputs,
    Ready,
    Rejected,
    ResetPrefixCache,
    StatsReply,
    ToEngine,
)
from frame.engine.wire.codec import decode, encode
from frame.engine.wire.requests import EngineRequest, EngineStats
from frame.errors import FrameUsageError

log = logging.getLogger("frame.engine.client")


class EngineDeadError(RuntimeError):
    """The engine core is gone (its process died or its loop crashed); requests cannot complete."""


class EngineRefusedError(EngineDeadError, FrameUsageError):
    """The engine process refused to start on the user's mistake (an unknown plugin, a missing model): a dead
    engine to code that waits for one, and the one sentence that names the fix to the user."""

    def __init__(self, message: str) -> None:
        FrameUsageError.__init__(self, message)


@dataclass(frozen=True)
class RankState:
    """One engine core as ``/health``, ``/version`` and ``/metrics`` report it: ``status`` is ``ok`` (serving),
    ``starting`` (being started or restarted) or ``down``; ``routed`` counts the prompts a data-parallel router
    sent it (None without one)."""

    rank: int
    status: str
    pid: int | None = None
    routed: int | None = None


class EngineClient(ABC):
    """Talks to one engine core. Use from a single asyncio event loop; ``start`` first."""

    #: "mp" or "inproc"
    mode: str = ""

    def __init__(self) -> None:
        self.info: Ready | None = None
        self.dead_reason: str | None = None
        self.listener: Callable[[Outputs | Rejected], None] | None = None
        self.on_dead: Callable[[str], None] | None = None
        #: Called with sequence ids that can no longer finish and why, when one of several engine cores dies
        #: while the others keep serving (data parallelism); a lone core's death goes to ``on_dead`` instead.
        self.on_lost: Callable[[list[str], str], None] | None = None
        self._ready: asyncio.Future[Ready] | None = None
        self._calls: dict[int, asyncio.Future[EngineStats]] = {}
        self._call_ids = itertools.count()

    # -- the interface -------------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 600.0) -> Ready:
        """Start the engine core and wait until it is built; raises EngineDeadError if it fails to start
        (EngineRefusedError, also a FrameUsageError, when it refused the user's mistake)."""
        self._ready = asyncio.get_running_loop().create_future()
        await self._launch()
        try:
            self.info = await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except asyncio.TimeoutError:
            await self.shutdown()
            raise EngineDeadError(f"the engine did not start within {timeout_s:.0f} s") from None
        return self.info

    def add(self, requests: list[EngineRequest]) -> None:
        """Send sequences to schedule; their outputs reach ``listener``.

        The message first goes through the engine's own codec, in both engine forms: a value msgpack cannot hold
        (an integer past 64 bits) or that the engine's decoder refuses raises here, as a usage error of this one
        request, instead of reaching (and ending) the engine loop.
        """
        self._check_alive()
        msg = AddRequests(requests)
        try:
            data = encode(msg)
            decode(data, ToEngine)
        except (OverflowError, TypeError, ValueError, msgspec.MsgspecError) as err:
            raise FrameUsageError(f"The request cannot be sent to the engine: {err}.") from None
        self._send_encoded(msg, data)

    def abort(self, request_ids: list[str]) -> None:
        """Abort sequences (their blocks return to the pool); a no-op once the engine is dead."""
        if request_ids and self.healthy:
            self._send(AbortRequests(request_ids))

    async def stats(self, timeout_s: float = 5.0) -> EngineStats:
        """A snapshot of the engine core's gauges and counters."""
        self._check_alive()
        call_id = next(self._call_ids)
        fut: asyncio.Future[EngineStats] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        self._send(GetStats(call_id))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._calls.pop(call_id, None)

    async def rank_stats(self) -> dict[int, EngineStats]:
        """Each serving engine core's stats, by data-parallel rank (one core: rank 0)."""
        return {0: await self.stats()}

    def rank_states(self) -> list[RankState]:
        """Every engine core's state, by data-parallel rank (one core: rank 0)."""
        status = "ok" if self.healthy else "starting" if self.dead_reason is None else "down"
        return [RankState(0, status, self.pid)]

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix of an idle engine (benchmarks start each run cold)."""
        self._check_alive()
        self._send(ResetPrefixCache())

    @property
    def healthy(self) -> bool:
        return self.info is not None and self.dead_reason is None

    @property
    def pid(self) -> int | None:
        """The process id of the engine core (this process for in-process engines)."""
        return self.info.pid if self.info else None

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine core and release its resources; safe to call twice."""

    # -- for subclasses ------------------------------------------------------------------------------------
    @abstractmethod
    async def _launch(self) -> None:
        """Start the engine core (without waiting for Ready)."""

    @abstractmethod
    def _send(self, msg: ToEngine) -> None:
        """Deliver one message to the engine loop without blocking."""

    def _send_encoded(self, msg: ToEngine, data: bytes) -> None:
        """Deliver ``msg``, already encoded as ``data``: a transport that sends bytes sends those instead of
        encoding the message again (an in-process one passes the object)."""
        self._send(msg)

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(f"the engine is not running: {self.dead_reason}")

    def _dispatch(self, msg: FromEngine) -> None:
        if isinstance(msg, Ready):
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(msg)
        elif isinstance(msg, StatsReply):
            fut = self._calls.pop(msg.call_id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg.stats)
        elif isinstance(msg, Failed) and msg.usage:
            self._die(msg.message, EngineRefusedError(msg.message))
        elif isinstance(msg, Failed):
            self._die(f"the engine failed: {msg.message}")
        elif self.listener is not None:
            self.listener(msg)

    def _die(self, reason: str, start_error: EngineRefusedError | None = None) -> None:
        """Mark the engine dead; ``start_error``: it refused to start on the user's mistake (``start`` raises it,
        and there is no crash to log)."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        if start_error is None:
            log.error("engine died: %s", reason)
        error = EngineDeadError(reason)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(start_error or error)
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(error)
        self._calls.clear()
        if self.on_dead is not None:
            self.on_dead(reason)
