"""PipedWorker: a child process of the API server that answers codec frames on its stdin with frames on its stdout.

The chat-template workers (:mod:`frame.server.render_worker`) and the constraint worker
(:mod:`frame.server.constraint_worker`) are such children: started through :func:`frame.engine.process.spawn_piped`,
sent one init message that they answer with a ready message, then one job at a time. A job that runs past its
time limit is ended by killing the process (a thread could not be stopped); whoever owns the worker starts another.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import msgspec

from frame.engine.process import spawn_piped
from frame.engine.wire.codec import FRAME_HEADER, decode, encode_frame


class PipedWorker:
    """One worker process and its two pipes; ``replies`` is the wire type (a tagged union) its answers decode to."""

    def __init__(self, proc: asyncio.subprocess.Process, replies: Any) -> None:
        self.proc, self.replies = proc, replies

    @classmethod
    async def start(cls, module: str, init: msgspec.Struct, replies: Any, ready: type, what: str,
                    timeout_s: float) -> PipedWorker:
        """Start ``python -m module``, send ``init`` and wait (at most ``timeout_s``) for its ``ready`` answer;
        RuntimeError naming ``what`` (the worker's kind, for the log) when it exits or answers otherwise."""
        worker = cls(await spawn_piped(module, []), replies)
        try:
            answer = await asyncio.wait_for(worker.call(init), timeout_s)
        except asyncio.IncompleteReadError:
            await worker.kill()
            raise RuntimeError(f"a {what} exited while starting; the log above says why") from None
        except BaseException:
            await worker.kill()
            raise
        if not isinstance(answer, ready):
            await worker.kill()
            raise RuntimeError(f"the {what} answered {type(answer).__name__} instead of ready")
        return worker

    async def call(self, msg: msgspec.Struct | bytes) -> Any:
        """Send one message (or an already encoded frame) and wait for the answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(msg if isinstance(msg, bytes) else encode_frame(msg))
        await self.proc.stdin.drain()
        (size,) = FRAME_HEADER.unpack(await self.proc.stdout.readexactly(FRAME_HEADER.size))
        return decode(await self.proc.stdout.readexactly(size), self.replies)

    def cpu_seconds(self) -> float | None:
        """CPU seconds (user and system) the worker has run so far, or None where ``/proc`` cannot say."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()
