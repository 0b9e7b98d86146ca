"""MultiprocExecutor: one worker process per tensor-parallel rank, driven over ZeroMQ with msgpack messages.

Each rank gets its own PUSH socket for orders (so no message is ever lost to a late subscriber) and every rank
answers on one PULL socket. A step is broadcast as the msgpack of its plan; every rank runs it, the ranks meet in
their collectives, and rank 0 (the driver) answers. While waiting, the executor polls its workers' processes, so
a worker that dies (killed, crashed) is noticed within a tenth of a second: the step raises
:class:`~frame.engine.core.executor.base.WorkerDiedError` and the remaining workers are stopped, never left blocking.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
import time
from pathlib import Path

import zmq

from frame.config import EngineConfig
from frame.engine.core.executor.base import Executor, WorkerDiedError
from frame.engine.process import CONFIG_ENV, MAX_MODEL_LEN_ENV, free_tcp_port, spawn
from frame.engine.wire.codec import decode, encode
from frame.engine.wire.core_worker import (
    AllocateKV,
    FromWorker,
    KVAllocated,
    RunStep,
    StepDone,
    StopWorker,
    WorkerFailed,
    WorkerReady,
)
from frame.engine.wire.plan import RunnerOutput, SchedulerOutput

log = logging.getLogger("frame.executor")

#: How often a waiting executor looks at its workers' processes (seconds).
POLL_S = 0.1
#: How long the workers may take to build their model shards.
START_TIMEOUT_S = 900.0


class MultiprocExecutor(Executor):
    """Starts ``world_size`` worker processes at construction and waits until each has built its shard."""

    def __init__(self, config: EngineConfig, max_model_len: int, world_size: int) -> None:
        self.world_size = world_size
        self._folder = tempfile.mkdtemp(prefix="frame-workers-")
        self._ctx = zmq.Context()
        self._answers = self._ctx.socket(zmq.PULL)
        self._answers.bind(f"ipc://{self._folder}/answers")
        self._orders: list[zmq.Socket] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._bytes_per_block = 0
        self._closed = False
        env = {CONFIG_ENV: config.model_dump_json(), MAX_MODEL_LEN_ENV: str(max_model_len)}
        init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
        try:
            for rank in range(world_size):
                orders = self._ctx.socket(zmq.PUSH)
                orders.setsockopt(zmq.LINGER, 0)
                orders.bind(f"ipc://{self._folder}/rank{rank}")
                self._orders.append(orders)
                self._procs.append(spawn(
                    "frame.engine.worker.proc",
                    ["--rank", str(rank), "--world-size", str(world_size), "--init-method", init_method,
                     "--inbox", f"ipc://{self._folder}/rank{rank}", "--outbox", f"ipc://{self._folder}/answers"],
                    env, stdin=None,
                ))
            ready = self._gather(WorkerReady, world_size, START_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self._kv_blocks = min(msg.kv_blocks for msg in ready)
        self._bytes_per_block = next(msg.bytes_per_block for msg in ready if msg.rank == 0)

    # -- the interface ------------------------------------------------------------------------------------
    def available_kv_blocks(self) -> int:
        return self._kv_blocks

    def allocate_kv(self, num_blocks: int) -> list[int]:
        self._broadcast(encode(AllocateKV(num_blocks)))
        answers = self._gather(KVAllocated, self.world_size, START_TIMEOUT_S)
        return next((msg.decode_graphs for msg in answers if msg.rank == 0), [])

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        self._broadcast(encode(RunStep(plan)))
        return self._gather(StepDone, 1, None)[0].output

    def check_health(self) -> None:
        reason = self._dead_peer(wait_s=0.0)
        if reason is not None:
            self._stop(graceful=False)
            raise WorkerDiedError(reason)

    def shutdown(self) -> None:
        self._stop(graceful=True)

    def _stop(self, graceful: bool) -> None:
        """Stop every worker: asked to leave its loop, or (after a failure, when the survivors may be blocked in
        a collective with the dead one) killed at once."""
        if self._closed:
            return
        self._closed = True
        for orders, proc in zip(self._orders, self._procs, strict=False):
            if proc.poll() is None:
                if graceful:
                    try:
                        orders.send(encode(StopWorker()), zmq.NOBLOCK)
                    except zmq.ZMQError:
                        proc.kill()
                else:
                    proc.kill()
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for sock in (*self._orders, self._answers):
            sock.close(linger=0)
        self._ctx.term()
        for path in Path(self._folder).glob("*"):
            path.unlink(missing_ok=True)
        Path(self._folder).rmdir()

    @property
    def bytes_per_block(self) -> int:
        return self._bytes_per_block

    def _dead_peer(self, wait_s: float = 1.0) -> str | None:
        """The first worker that has exited, as an error message, waiting up to ``wait_s`` for one. When a rank
        reports a failed collective the usual cause is a peer that died: naming that one (its exit may take a
        moment to be visible) beats naming the survivor that noticed."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, proc in enumerate(self._procs):
                code = proc.poll()
                if code is not None:
                    return f"the model worker of rank {rank} exited with code {code}"
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)

    # -- messaging ----------------------------------------------------------------------------------------
    def _broadcast(self, data: bytes) -> None:
        if self._closed:
            raise WorkerDiedError("the model workers were stopped")
        for orders in self._orders:
            orders.send(data)

    def _gather(self, kind: type, count: int, timeout_s: float | None) -> list:
        """Wait for ``count`` answers of type ``kind``, watching the workers; a failure report or a dead worker
        raises WorkerDiedError (after stopping the others)."""
        answers: list[FromWorker] = []
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(answers) < count:
            if self._answers.poll(int(POLL_S * 1000)):
                msg = decode(self._answers.recv(), FromWorker)
                if isinstance(msg, WorkerFailed):
                    reason = self._dead_peer() or f"the model worker of rank {msg.rank} failed: {msg.message}"
                    self._stop(graceful=False)
                    raise WorkerDiedError(reason)
                if isinstance(msg, kind):
                    answers.append(msg)
                continue
            self.check_health()
            if deadline is not None and time.monotonic() > deadline:
                self._stop(graceful=False)
                raise WorkerDiedError(f"the model workers did not answer within {timeout_s:.0f} s")
        return answers
