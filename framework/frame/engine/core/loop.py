"""EngineLoop: the busy loop around an EngineCore, shared by the child process and the in-process thread.

It steps the core while it has work and blocks on its input when idle. Messages arrive through ``recv`` and
answers leave through ``send``; the transport (ZeroMQ sockets or thread-safe queues) is the caller's.
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Callable
from typing import TypeVar

import torch

from frame.config import EngineConfig
from frame.engine.core.compile_queue import CompileQueue
from frame.engine.core.engine_core import EngineCore
from frame.engine.selection import select_model_family, select_quantization
from frame.engine.wire.client_core import (
    AbortRequests,
    AddRequests,
    CoreLoad,
    FromEngine,
    GetStats,
    Outputs,
    Ready,
    Rejected,
    ResetPrefixCache,
    Shutdown,
    StatsReply,
    ToEngine,
)
from frame.engine.wire.requests import EngineRequest
from frame.errors import FrameUsageError
from frame.heap import IdleTrim
from frame.interfaces.kv_dtype import kv_dtype_name

log = logging.getLogger("frame.engine.loop")

#: How long an idle loop blocks on its input before looking around again (seconds).
IDLE_WAIT_S = 1.0
#: How long it blocks while a grammar compiles and nothing else runs (the compile's end is polled, not signalled).
COMPILE_WAIT_S = 0.02

T = TypeVar("T")


def ready_message(core: EngineCore, pid: int) -> Ready:
    """What the client needs to know about a freshly built core, and what it runs with."""
    selection, config = core.selection, core.config
    dtype = str(selection.dtype).removeprefix("torch.")
    method = select_quantization(core.hooks, config, core.source, selection.platform)  # as the worker chose it
    quantization = method.name if method is not None else None
    paths = selection.platform.kernel_paths()
    packed = [path for fmt, path in paths.items() if fmt not in ("float32", "bfloat16", "float16")]
    isa_path = (packed[0] if quantization and packed else paths.get(dtype, ""))
    return Ready(pid=pid, max_model_len=core.max_model_len, vocab_size=int(core.source.hf_config.vocab_size),
                 num_blocks=core.num_blocks, model_name=core.source.name,
                 max_speculative_tokens=core.max_speculative_tokens,
                 family=select_model_family(core.hooks, core.source.architecture), dtype=dtype,
                 quantization=quantization, platform=selection.platform.describe(), isa_path=isa_path,
                 attn=selection.attn, cache=selection.cache, sched=selection.sched, block_size=config.block_size,
                 kv_bytes=core.num_blocks * core.executor.bytes_per_block,
                 kv_dtype=kv_dtype_name(selection.kv_dtype or selection.dtype), decode_graphs=core.decode_graphs)


def drain(inbox: queue.SimpleQueue[T], timeout_s: float) -> list[T]:
    """Everything waiting in ``inbox``, after waiting up to ``timeout_s`` for a first item (maybe nothing)."""
    items: list[T] = []
    try:
        items.append(inbox.get(timeout=timeout_s) if timeout_s > 0 else inbox.get_nowait())
        while True:
            items.append(inbox.get_nowait())
    except queue.Empty:
        pass
    return items


def serve_core(config: EngineConfig, send: Callable[[FromEngine], None],
               recv: Callable[[float], list[ToEngine]]) -> None:
    """Build an EngineCore from ``config``, send its :class:`Ready`, and run its loop until a Shutdown message;
    what building or the loop raises is the caller's to report (a thread, a child process, a Ray actor)."""
    core = EngineCore(config)
    send(ready_message(core, os.getpid()))
    EngineLoop(core, send).run(recv)


class EngineLoop:
    """Runs one EngineCore: applies client messages between steps and sends every step's outputs, each with the
    core's load (a data-parallel router weighs cores by it)."""

    def __init__(self, core: EngineCore, send: Callable[[FromEngine], None]) -> None:
        self.core = core
        self.send = send
        self.received = 0
        self.compiling = CompileQueue(core.structured)
        self.trim = IdleTrim()

    def load(self) -> CoreLoad:
        return CoreLoad(self.received, self.core.num_requests + len(self.compiling), self.core.outstanding_tokens())

    def _add(self, req: EngineRequest, error: BaseException | None = None) -> None:
        """Hand ``req`` to the core (or, with ``error`` from its compile, reject it); a bad request is a Rejected
        answer, never the end of the loop."""
        try:
            if error is not None:
                raise error
            self.core.add_request(req)
        except FrameUsageError as err:
            self.send(Rejected(req.request_id, err.message, err.status, err.code, err.param))
        except ValueError as err:
            self.send(Rejected(req.request_id, str(err)))
        except Exception:  # one request the core cannot take must not end the loop for every other
            log.exception("the engine could not add request %s", req.request_id)
            self.send(Rejected(req.request_id, "The engine could not add this request.", 500, "internal_error"))

    def handle(self, msg: ToEngine) -> bool:
        """Apply one message; False means shut down."""
        if isinstance(msg, AddRequests):
            self.received += len(msg.requests)
            for req in msg.requests:
                if self.compiling.needs(req):
                    self.compiling.submit(req)
                else:
                    self._add(req)
        elif isinstance(msg, AbortRequests):
            for req_id in self.compiling.cancel(msg.request_ids):  # the client forgets it on this answer
                self.send(Rejected(req_id, "The request was aborted while its grammar compiled.", 499, "aborted"))
            outputs = self.core.abort(msg.request_ids)
            if outputs:
                self.send(Outputs(outputs, self.load()))
        elif isinstance(msg, GetStats):
            self.send(StatsReply(msg.call_id, self.core.stats()))
        elif isinstance(msg, ResetPrefixCache):
            if not self.core.reset_prefix_cache():
                log.warning("the prefix cache was not reset: requests still hold blocks")
        elif isinstance(msg, Shutdown):
            return False
        return True

    def run(self, recv: Callable[[float], list[ToEngine]]) -> None:
        """Loop until a Shutdown message. ``recv(timeout)`` returns the messages waiting (maybe none). The core's
        model workers are stopped when the loop ends, however it ends (a dead worker raises out of a step)."""
        try:
            self._run(recv)
        finally:
            self.compiling.close()
            self.core.shutdown()

    @torch.inference_mode()
    def _run(self, recv: Callable[[float], list[ToEngine]]) -> None:
        while True:
            busy = self.core.has_unfinished()
            msgs = recv(0.0 if busy else COMPILE_WAIT_S if self.compiling else IDLE_WAIT_S)
            if msgs or busy:
                self.trim.busy()
            elif not self.compiling:
                self.trim.maybe()  # idle after a burst: give the freed heap back
            for msg in msgs:
                if not self.handle(msg):
                    log.info("engine loop shutting down")
                    return
            compiled = self.compiling.ready()
            for req, error in compiled:
                self._add(req, error)
            if compiled or any(isinstance(msg, AddRequests) for msg in msgs):
                self.send(Outputs([], self.load()))
            if self.core.has_unfinished():
                outputs = self.core.step()
                if outputs:
                    self.send(Outputs(outputs, self.load()))
