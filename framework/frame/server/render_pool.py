"""RenderPool: chat templates rendered in worker processes that are killed when they pass the time limit.

Each worker (:mod:`frame.server.render_worker`) renders one conversation at a time. A render that takes longer
than ``timeout_s`` is answered with a 400 naming the limit; its worker gets SIGKILL (a thread could not be
stopped, and a spinning template would keep a core forever) and a fresh one starts in the background. The time
limit counts from the moment a worker takes the job; waiting for a free worker is bounded separately.

A job is encoded before it takes a worker, so a value msgpack cannot carry is the request's 400, not a lost
worker. Whatever else goes wrong while a worker holds a job (any exception, a cancellation), the worker is
replaced, never dropped; and each worker is watched, so one killed from outside is replaced at once (in about a
second, its start time). :attr:`RenderPool.short` is how many workers are missing meanwhile; ``/health`` reports
``degraded`` while it is not zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

import msgspec

from frame.engine.wire.codec import encode_frame
from frame.engine.wire.render import FromRenderWorker, Init, Ready, Refused, Render, Rendered
from frame.server.errors import ServerError
from frame.server.piped import PipedWorker

log = logging.getLogger("frame.server")

#: Seconds a worker has to start (import jinja and transformers' template helpers).
START_TIMEOUT_S = 120.0
#: Codes of the refusals whose worker was killed and is being replaced (the time limit, a failed hand-off).
REPLACED = frozenset({"template_timeout", "template_failed"})
#: Seconds between attempts to replace a worker that failed to start.
RESPAWN_DELAY_S = 1.0


class _Worker(PipedWorker):
    """One chat-template worker process."""

    @classmethod
    async def begin(cls, init: Init) -> _Worker:
        worker = await cls.start("frame.server.render_worker", init, FromRenderWorker, Ready, "chat-template worker",
                                 START_TIMEOUT_S)
        return worker  # type: ignore[return-value]

    async def render(self, job: bytes) -> Rendered | Refused:
        """Send one encoded :class:`Render` and wait for the answer."""
        reply = await self.call(job)
        if isinstance(reply, Ready):
            raise RuntimeError("the render worker answered ready to a render")
        return reply


class RenderPool:
    """``size`` render workers behind one async :meth:`render`; ``start`` first, ``close`` at the end."""

    def __init__(self, init: Init, size: int, timeout_s: float) -> None:
        self.init, self.size, self.timeout_s = init, size, timeout_s
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._workers: set[_Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        workers = await asyncio.gather(*(_Worker.begin(self.init) for _ in range(self.size)))
        for worker in workers:
            self._add(worker)

    def _add(self, worker: _Worker) -> None:
        self._workers.add(worker)
        self._idle.put_nowait(worker)
        self._spawn(self._watch(worker))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, worker: _Worker) -> None:
        """Replace ``worker`` when its process ends while the pool still counts it (killed from outside)."""
        await worker.proc.wait()
        if worker in self._workers and not self._closed:
            log.error("a chat-template worker (pid %d) exited with %s; it is replaced", worker.proc.pid,
                      worker.proc.returncode)
            self._replace(worker)

    @property
    def short(self) -> int:
        """Workers missing from the pool (being replaced); 0 when it is whole."""
        return max(self.size - len(self._workers), 0)

    async def _take(self) -> _Worker:
        """A live idle worker; one that died while idle is skipped (its watcher is already replacing it)."""
        while True:
            worker = await self._idle.get()
            if worker in self._workers and worker.proc.returncode is None:
                return worker

    async def render(self, job: Render) -> str:
        """The rendered conversation; a ServerError (400, or 503 when no worker frees up) otherwise."""
        try:
            payload = encode_frame(job)
        except (OverflowError, RecursionError, TypeError, ValueError, msgspec.EncodeError) as err:
            raise ServerError(f"The conversation cannot be passed to the chat template ({err}); send plain JSON "
                              "values with integers of at most 64 bits.", status=400, code="invalid_value",
                              param="messages") from None
        wait_s = START_TIMEOUT_S + self.timeout_s
        try:
            worker = await asyncio.wait_for(self._take(), wait_s)
        except asyncio.TimeoutError:
            raise ServerError(f"No chat-template worker was free within {wait_s:.0f} s; retry shortly.", status=503,
                              code="server_busy", headers={"Retry-After": "1"}) from None
        # The job runs as its own task: a client that disconnects must not leave a worker mid-reply in the pool.
        task = asyncio.ensure_future(self._run(worker, payload))
        self._tasks.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._tasks.discard)  # type: ignore[arg-type]
        reply = await asyncio.shield(task)
        if isinstance(reply, Refused):
            raise ServerError(reply.message, status=400, code=reply.code, param="messages")
        return reply.text

    async def _run(self, worker: _Worker, job: bytes) -> Rendered | Refused:
        try:
            reply = await asyncio.wait_for(worker.render(job), self.timeout_s)
        except asyncio.TimeoutError:
            log.warning("a chat template ran past %.1f s; its worker is killed and replaced", self.timeout_s)
            self._replace(worker)
            return Refused(f"The chat template took longer than this server's limit of {self.timeout_s:g} s "
                           "(--tokenize-timeout) to render; send a shorter conversation or a simpler template.",
                           "template_timeout")
        except asyncio.CancelledError:  # the pool closes: the worker may be mid-reply, so it cannot serve again
            self._replace(worker)
            raise
        except Exception as err:  # any failure of the hand-off (a dead pipe, a bad frame, a bug): a fresh worker
            log.error("a chat-template worker failed (%s: %s); it is replaced", type(err).__name__, err)
            self._replace(worker)
            return Refused("The chat template could not be rendered within this server's limits; send a shorter "
                           "conversation or a simpler template.", "template_failed")
        self._idle.put_nowait(worker)
        return reply

    def _replace(self, worker: _Worker) -> None:
        """Take ``worker`` out of the pool (once) and start its successor in the background."""
        if worker not in self._workers:
            return
        self._workers.discard(worker)
        if self._closed:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.kill()
            return
        self._spawn(self._respawn(worker))

    async def _respawn(self, old: _Worker) -> None:
        await old.kill()
        while not self._closed:
            try:
                self._add(await _Worker.begin(self.init))
                return
            except Exception as err:
                log.error("a chat-template worker failed to start (%s); retrying", err)
                await asyncio.sleep(RESPAWN_DELAY_S)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and logs)."""
        return [w.proc.pid for w in self._workers]

    async def close(self) -> None:
        """Kill every worker; safe to call twice."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for worker in list(self._workers):
            await worker.kill()
        self._workers.clear()
