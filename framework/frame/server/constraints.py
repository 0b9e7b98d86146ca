"""Constraints: a request's ``response_format`` or ``structured_outputs``, made a StructuredOutputs and checked.

The server compiles every constraint with its own instance of the engine's grammar backend (``--grammar-backend``)
before admitting the request, so a schema, regex or grammar the backend cannot compile is a 400 naming the field,
streaming or not, and never reaches the engine. Compiled constraints are cached (a few hundred distinct ones), so
the check costs a dictionary lookup for a schema a client sends again; the engine compiles its own copy once too.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from frame.config import EngineConfig, resolve_plugin_options
from frame.errors import InvalidSamplingError
from frame.interfaces.grammar import GrammarBackend
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.sampling_params import StructuredOutputs
from frame.server.errors import ClientDisconnectedError
from frame.server.schemas import SamplingFields

CACHE_SIZE = 256


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
                 counter: Any = None) -> None:
        self.config, self.tokenizer, self.vocab_size, self.stop = config, tokenizer, vocab_size, stop_token_ids
        self.counter = counter  # frame_grammar_compilations, by outcome
        self._backend: GrammarBackend | None = None
        self._good: OrderedDict[str, None] = OrderedDict()
        self._lock = asyncio.Lock()

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
        if self._backend is None:
            self._backend = self._build()
        self._backend.compile(spec)

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
        (ClientDisconnectedError) and never reaches the engine, which would compile it too."""
        key = spec.key()
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
            try:
                await asyncio.to_thread(self._compile, spec)
            except InvalidSamplingError as err:
                self._count("failed")
                if field.startswith("structured_outputs"):
                    raise
                reason = err.message.split(" ", 1)[1] if " " in err.message else err.message
                raise InvalidSamplingError(f"{field} {reason}", param=field) from None
            self._count("compiled")
        self._good[key] = None
        if len(self._good) > CACHE_SIZE:
            self._good.popitem(last=False)
