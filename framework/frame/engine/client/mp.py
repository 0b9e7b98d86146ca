"""MPEngineClient: the engine core in a child process, reached over two ZeroMQ ipc:// sockets.

The client binds both sockets in a private temporary directory and starts ``python -m frame.engine.core.proc``
with the EngineConfig as JSON in its environment, so nothing is pickled. A reader task decodes what the engine
sends; a watchdog task notices the process exiting (crash, OOM kill, SIGKILL) and fails every open request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile

import zmq
import zmq.asyncio

from frame.config import EngineConfig
from frame.engine.client.base import EngineClient
from frame.engine.process import CONFIG_ENV, spawn
from frame.engine.wire.client_core import FromEngine, Shutdown, ToEngine
from frame.engine.wire.codec import decode, encode

#: How often the watchdog checks that the engine process is alive (seconds).
WATCH_INTERVAL_S = 0.2


#: The default leaves the API server a core only where every engine keeps at least this many after it. On 2 cores,
#: leaving one halves the engine's compute for a server that used under 2% of a core: at concurrency 8 and 32 frame
#: served 1.5x the tokens with the engine on both cores (docs/performance-history.md, "Serving").
MIN_ENGINE_CORES_TO_RESERVE = 4


def cores_for_engine(reserved: int | None, engines: int = 1) -> list[int] | None:
    """The cores an engine process may use when ``reserved`` of this process's cores are left to the API server
    (None: 1 where, after it, every one of the ``engines`` engine processes of this host, one per data-parallel
    core, still has ``MIN_ENGINE_CORES_TO_RESERVE`` cores, else 0); None when the engine should keep them all.
    A reserved core keeps the server's event loop and the engine's OpenMP barriers from preempting each other,
    which matters on a busy host (docs/performance-history.md, "Serving")."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if reserved is None:
        reserved = 1 if len(cores) - 1 >= MIN_ENGINE_CORES_TO_RESERVE * max(1, engines) else 0
    if reserved == 0:
        return None
    return cores[:max(1, len(cores) - reserved)]


class MPEngineClient(EngineClient):
    """Runs the engine core in a child process (the default of ``frame serve``)."""

    mode = "mp"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__()
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="frame-engine-")
        self._ctx = zmq.asyncio.Context()
        self._to_engine = self._ctx.socket(zmq.PUSH)
        self._from_engine = self._ctx.socket(zmq.PULL)
        self._tasks: list[asyncio.Task[None]] = []

    async def _launch(self) -> None:
        input_addr, output_addr = f"ipc://{self._dir}/input", f"ipc://{self._dir}/output"
        self._to_engine.setsockopt(zmq.LINGER, 0)
        self._to_engine.bind(input_addr)
        self._from_engine.bind(output_addr)
        self.process = spawn("frame.engine.core.proc", ["--input", input_addr, "--output", output_addr],
                             {CONFIG_ENV: self.config.model_dump_json()})
        engine_cores = cores_for_engine(self.config.reserved_cores, self.config.data_parallel_size)
        if engine_cores is not None:  # before the child starts its thread pools: they inherit the mask
            os.sched_setaffinity(self.process.pid, engine_cores)
        self._tasks = [asyncio.create_task(self._read(), name="engine-reader"),
                       asyncio.create_task(self._watch(), name="engine-watchdog")]

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _send(self, msg: ToEngine) -> None:
        self._to_engine.send(encode(msg), copy=False)

    def _send_encoded(self, msg: ToEngine, data: bytes) -> None:
        self._to_engine.send(data, copy=False)

    async def _read(self) -> None:
        while True:
            data = await self._from_engine.recv()
            self._dispatch(decode(data, FromEngine))

    async def _watch(self) -> None:
        assert self.process is not None
        while (code := self.process.poll()) is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
        await asyncio.sleep(WATCH_INTERVAL_S)  # let a last Failed message arrive first
        self._die(f"the engine process {self.process.pid} exited with code {code}")

    async def shutdown(self) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            if self.dead_reason is None:
                self._send(Shutdown())
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), 5.0)
            except asyncio.TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)
        if self.dead_reason is None:
            self.dead_reason = "the engine was shut down"
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self._to_engine.close(linger=0)
        self._from_engine.close(linger=0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)
