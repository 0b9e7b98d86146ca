"""Constraints: a request's ``response_format`` or ``structured_outputs``, made a StructuredOutputs and checked.

The server compiles every constraint with the engine's grammar backend (``--grammar-backend``) before admitting the
request, so a schema, regex or grammar the backend cannot compile is a 400 naming the field, streaming or not, and
never reaches the engine. Compilation runs in a worker process of its own (:mod:`frame.server.constraint_worker`,
started at the first constraint, at a lower priority than the engine) under a time limit: ``--grammar-compile-timeout``
seconds of the worker's CPU time, and twice that by the clock. A constraint that does not compile in time is a 400
naming the limit, its worker is killed (a thread could not be stopped) and a fresh one starts, and the same constraint
sent again is refused at once. The size bounds (``--max-choice-chars`` here, the backend's repetition and depth
bounds) refuse the costliest constraints before any compile.

The server keeps no compiled grammar: it remembers only the SHA-256 digests of the constraints that compiled (and
of those too slow to), so a schema a client sends again costs a dictionary lookup; the engine compiles and caches
its own copy (bounded in bytes, ``--grammar-cache-bytes``), which takes no longer than the check here did.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from frame.config import EngineConfig
from frame.engine.wire.constraint import Check, CheckInit, FromConstraintWorker
from frame.engine.wire.render import Ready
from frame.errors import InvalidSamplingError
from frame.sampling_params import StructuredOutputs
from frame.server.errors import ClientDisconnectedError, ServerError
from frame.server.piped import PipedWorker
from frame.server.schemas import SamplingFields

log = logging.getLogger("frame.server")

#: Digests of constraints remembered as compiled (or as too slow): 32 bytes each.
CACHE_SIZE = 4096
#: A compile is stopped at this multiple of ``--grammar-compile-timeout`` by the clock, whatever CPU time it used.
CLOCK_FACTOR = 2.0
#: Seconds between reads of the compiling worker's CPU time.
CPU_POLL_S = 0.1
#: Seconds the constraint worker has to start (import the backend, load the tokenizer, build its tables).
START_TIMEOUT_S = 120.0


def requested_constraint(req: SamplingFields) -> tuple[StructuredOutputs, str] | None:
    """The StructuredOutputs a request's own fields ask for and the field that asked (None: none)."""
    fmt, fields = req.response_format, req.structured_outputs
    if fmt is not None and fields is not None and fmt.type != "text":
        raise InvalidSamplingError("Send response_format or structured_outputs, not both.",
                                   param="structured_outputs")
    if fields is not None:
        schema = fields.json_
        spec = StructuredOutputs(json=schema if isinstance(schema, str) or schema is None else json.dumps(schema),
                                 json_object=bool(fields.json_object), regex=fields.regex, choice=fields.choice,
                                 grammar=fields.grammar)
        return spec, "structured_outputs"
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputs(json_object=True), "response_format"
    if fmt.json_schema is None:
        raise InvalidSamplingError("response_format of type json_schema needs a json_schema with a name and a "
                                   "schema.", param="response_format.json_schema")
    schema = fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {"type": "object"}
    return StructuredOutputs(json=json.dumps(schema)), "response_format.json_schema.schema"


class ConstraintChecker:
    """Compiles constraints in a worker process (started on first use), remembering the good ones."""

    def __init__(self, config: EngineConfig, vocab_size: int, stop_token_ids: list[int], counter: Any = None,
                 timeout_s: float = 20.0, max_choice_chars: int = 16384, seconds: Any = None) -> None:
        self.init = CheckInit(config.model_dump_json(), vocab_size, list(stop_token_ids))
        self.counter = counter  # frame_grammar_compilations, by outcome
        self.seconds = seconds  # frame_grammar_compile_seconds (a histogram)
        self.timeout_s, self.max_choice_chars = timeout_s, max_choice_chars
        self.clock_limit_s = CLOCK_FACTOR * timeout_s
        self._worker: asyncio.Task[PipedWorker] | None = None
        self._reaping: set[asyncio.Future[None]] = set()
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._slow: OrderedDict[bytes, None] = OrderedDict()
        self._lock = asyncio.Lock()

    def _count(self, outcome: str) -> None:
        if self.counter is not None:
            self.counter.labels(outcome=outcome).inc()

    def _observe(self, seconds: float) -> None:
        if self.seconds is not None:
            self.seconds.observe(seconds)

    def _start_worker(self) -> None:
        self._worker = asyncio.ensure_future(PipedWorker.start(
            "frame.server.constraint_worker", self.init, FromConstraintWorker, Ready, "constraint worker",
            START_TIMEOUT_S))

    def _started(self) -> PipedWorker | None:
        """The worker, once its start has succeeded (None while starting, or after a failed start)."""
        task = self._worker
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    async def _ready_worker(self) -> PipedWorker:
        """The live worker, started (or restarted) as needed; its start is outside any compile's time limit."""
        started = self._started()
        if self._worker is None or (self._worker.done() and (started is None or started.proc.returncode is not None)):
            self._start_worker()
        assert self._worker is not None
        return await asyncio.shield(self._worker)

    def _replace_worker(self, worker: PipedWorker) -> None:
        """Kill ``worker`` (mid-compile, or broken) and start its successor in the background."""
        with contextlib.suppress(ProcessLookupError):
            worker.proc.kill()
        reaped = asyncio.ensure_future(worker.kill())  # collects its exit status
        self._reaping.add(reaped)
        reaped.add_done_callback(self._reaping.discard)
        self._start_worker()

    def _check_sizes(self, spec: StructuredOutputs, field: str) -> None:
        """Bounds checked before compiling: a choice string's length (its compile time grows with its square)."""
        longest = max((len(choice) for choice in spec.choice or ()), default=0)
        if longest > self.max_choice_chars:
            param = f"{field}.choice" if field == "structured_outputs" else field
            raise ServerError(f"{param} holds a string of {longest} characters, over this server's limit of "
                              f"{self.max_choice_chars} (--max-choice-chars); send shorter choices.",
                              status=400, code="limit_exceeded", param=param)

    @staticmethod
    def _remember(seen: OrderedDict[bytes, None], key: bytes) -> None:
        seen[key] = None
        if len(seen) > CACHE_SIZE:
            seen.popitem(last=False)

    def close(self) -> None:
        """Kill the worker (the server stops); safe to call twice."""
        if self._worker is None:
            return
        started = self._started()
        if started is not None:
            with contextlib.suppress(ProcessLookupError):
                started.proc.kill()
        else:
            self._worker.cancel()  # a starting worker kills its process when cancelled
        self._worker = None

    async def drop_if_gone(self, disconnected: Callable[[], Awaitable[bool]]) -> None:
        """Raise ClientDisconnectedError when a constrained request's client left while its prompt was prepared:
        the engine would compile its grammar (seconds, in the loop every request shares) for nobody."""
        if await disconnected():
            self._count("skipped_disconnected")
            raise ClientDisconnectedError

    async def check(self, spec: StructuredOutputs, field: str,
                    disconnected: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Raise a usage error naming ``field`` (the request's own spelling) when ``spec`` cannot compile.

        Compilations run one at a time (each is CPU work of up to seconds); a request waits its turn, and when its
        turn comes and ``disconnected()`` says its client has left, it is dropped uncompiled
        (ClientDisconnectedError) and never reaches the engine, which would compile it too. A compile that passes
        ``timeout_s`` of CPU time is a 400 naming the limit and its flag, and its worker is killed."""
        key = hashlib.sha256(spec.key().encode()).digest()
        if key in self._slow:
            self._slow.move_to_end(key)
            self._count("timed_out")
            raise self._too_slow(field)
        if key in self._good:
            self._good.move_to_end(key)
            self._count("cached")
            return
        self._check_sizes(spec, field)  # a refusal by size waits for no other request's compile
        async with self._lock:
            if key in self._good:  # compiled while this request waited
                self._count("cached")
                return
            if disconnected is not None and await disconnected():
                self._count("skipped_disconnected")
                raise ClientDisconnectedError
            await self._compile(spec, field, key)
            self._count("compiled")
        self._remember(self._good, key)

    async def _compile(self, spec: StructuredOutputs, field: str, key: bytes) -> None:
        worker = await self._ready_worker()
        try:
            reply = await self._answer_within_limit(worker, Check(spec))
        except asyncio.TimeoutError:
            self._observe(self.timeout_s)
            self._count("timed_out")
            self._remember(self._slow, key)
            log.warning("a constraint ran past %.1f s to compile; its worker is killed and replaced", self.timeout_s)
            self._replace_worker(worker)
            raise self._too_slow(field) from None
        except BaseException as err:  # a dead pipe (the worker crashed on it), a cancellation mid-reply
            self._replace_worker(worker)
            if not isinstance(err, (asyncio.IncompleteReadError, ConnectionError)):
                raise
            log.error("the constraint worker exited while compiling a constraint; it is replaced")
            self._count("failed")
            raise ServerError(f"{field} could not be compiled within this server's limits; send a simpler "
                              "constraint.", status=400, code="grammar_failed", param=field) from None
        if isinstance(reply, Ready):
            self._replace_worker(worker)
            raise RuntimeError("the constraint worker answered ready to a constraint")
        self._observe(reply.seconds)
        if reply.message is None:
            return
        self._count("failed")
        if field.startswith("structured_outputs"):
            raise InvalidSamplingError(reply.message, param=reply.param)
        reason = reply.message.split(" ", 1)[1] if " " in reply.message else reply.message
        raise InvalidSamplingError(f"{field} {reason}", param=field)

    async def _answer_within_limit(self, worker: PipedWorker, check: Check) -> Any:
        """The worker's answer to ``check``; asyncio.TimeoutError once the compile has used ``timeout_s`` of the
        worker's CPU time, or ``clock_limit_s`` by the clock (the worker runs at a lower priority than the
        engine, so on a busy server a compile is slower by the clock, and is judged by what it costs)."""
        answer = asyncio.ensure_future(worker.call(check))
        started, cpu_before = time.monotonic(), worker.cpu_seconds()
        try:
            while True:
                done, _ = await asyncio.wait({answer}, timeout=CPU_POLL_S)
                if done:
                    return answer.result()
                clock = time.monotonic() - started
                cpu_now = worker.cpu_seconds()
                used = clock if cpu_before is None or cpu_now is None else cpu_now - cpu_before
                if used > self.timeout_s or clock > self.clock_limit_s:
                    raise asyncio.TimeoutError
        finally:
            answer.cancel()

    def _too_slow(self, field: str) -> ServerError:
        return ServerError(f"{field} did not compile within this server's limit of {self.timeout_s:g} s of CPU time "
                           "(--grammar-compile-timeout); send a simpler constraint.", status=400,
                           code="grammar_compile_timeout", param=field)
