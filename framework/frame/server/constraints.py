"""Constraints: a request's ``response_format`` or ``structured_outputs``, made a StructuredOutputs and checked.

The server compiles every constraint with its own instance of the engine's grammar backend (``--grammar-backend``)
before admitting the request, so a schema, regex or grammar the backend cannot compile is a 400 naming the field,
streaming or not, and never reaches the engine. Compilation runs in a thread of its own (xgrammar releases the GIL,
so the event loop goes on) under a time limit (``--grammar-compile-timeout``): a constraint that does not compile
in time is a 400 naming the limit, and the same constraint sent again is refused at once. A thread cannot be
stopped, so the late compile runs on to its end in a second thread while the next constraint compiles; the size
bounds (``--max-choice-chars`` here, the backend's repetition and depth bounds) keep such compiles rare.

The server keeps no compiled grammar: it remembers only the SHA-256 digests of the constraints that compiled (and
of those too slow to), so a schema a client sends again costs a dictionary lookup; the engine compiles and caches
its own copy (bounded in bytes, ``--grammar-cache-bytes``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from frame.config import EngineConfig, resolve_plugin_options
from frame.errors import InvalidSamplingError
from frame.interfaces.grammar import GrammarBackend
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.sampling_params import StructuredOutputs
from frame.server.errors import ClientDisconnectedError, ServerError
from frame.server.schemas import SamplingFields

#: Digests of constraints remembered as compiled (or as too slow): 32 bytes each.
CACHE_SIZE = 4096


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
    """Compiles constraints with the configured grammar backend (built on first use), remembering the good ones."""

    def __init__(self, config: EngineConfig, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                 counter: Any = None, timeout_s: float = 20.0, max_choice_chars: int = 16384,
                 seconds: Any = None) -> None:
        self.config, self.tokenizer, self.vocab_size, self.stop = config, tokenizer, vocab_size, stop_token_ids
        self.counter = counter  # frame_grammar_compilations, by outcome
        self.seconds = seconds  # frame_grammar_compile_seconds (a histogram)
        self.timeout_s, self.max_choice_chars = timeout_s, max_choice_chars
        self._backend: GrammarBackend | None = None
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._slow: OrderedDict[bytes, None] = OrderedDict()
        self._lock = asyncio.Lock()
        # Two threads: one compile at a time, and room for one that ran past its limit to finish.
        self._threads = ThreadPoolExecutor(2, thread_name_prefix="frame-grammar")

    def _count(self, outcome: str) -> None:
        if self.counter is not None:
            self.counter.labels(outcome=outcome).inc()

    def _build(self) -> GrammarBackend:
        hooks = PluginHooks(PluginRegistry())
        name = self.config.grammar_backend
        hooks.registry.load("grammar", name)
        options = resolve_plugin_options("grammar", name, self.config.grammar_options,
                                         hooks.options_model("grammar", name))
        return hooks.create_grammar_backend(name, self.tokenizer, self.vocab_size, self.stop, options)

    def _compile(self, spec: StructuredOutputs) -> None:
        assert self._backend is not None
        started = time.perf_counter()
        try:
            self._backend.compile(spec)
        finally:
            if self.seconds is not None:
                self.seconds.observe(time.perf_counter() - started)

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
        self._threads.shutdown(wait=False, cancel_futures=True)

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
        ``timeout_s`` is a 400 naming the limit and its flag."""
        key = hashlib.sha256(spec.key().encode()).digest()
        if key in self._slow:
            self._slow.move_to_end(key)
            self._count("timed_out")
            raise self._too_slow(field)
        if key in self._good:
            self._good.move_to_end(key)
            self._count("cached")
            return
        async with self._lock:
            if key in self._good:  # compiled while this request waited
                self._count("cached")
                return
            if disconnected is not None and await disconnected():
                self._count("skipped_disconnected")
                raise ClientDisconnectedError
            self._check_sizes(spec, field)
            loop = asyncio.get_running_loop()
            if self._backend is None:  # built once (seconds: the vocabulary's tables), outside any time limit
                self._backend = await loop.run_in_executor(self._threads, self._build)
            job = self._threads.submit(self._compile, spec)
            try:
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job)), self.timeout_s)
            except asyncio.TimeoutError:
                self._count("timed_out")
                if not job.cancel():  # it ran out of time itself (not queued behind two late compiles): remembered
                    self._remember(self._slow, key)
                raise self._too_slow(field) from None
            except InvalidSamplingError as err:
                self._count("failed")
                if field.startswith("structured_outputs"):
                    raise
                reason = err.message.split(" ", 1)[1] if " " in err.message else err.message
                raise InvalidSamplingError(f"{field} {reason}", param=field) from None
            self._count("compiled")
        self._remember(self._good, key)

    def _too_slow(self, field: str) -> ServerError:
        return ServerError(f"{field} did not compile within this server's limit of {self.timeout_s:g} s "
                           "(--grammar-compile-timeout); send a simpler constraint.", status=400,
                           code="grammar_compile_timeout", param=field)
