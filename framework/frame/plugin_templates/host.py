"""Templates of the kinds that serve requests' text on the host: grammar backend, tool-call parser."""

from __future__ import annotations

from frame.plugin_templates.kind import KindTemplate

GRAMMAR = KindTemplate(
    module="backend",
    plugin='''"""The {name} grammar backend plugin: its hooks."""

from __future__ import annotations

from typing import Any

from frame import hookimpl
from frame.interfaces.grammar import GrammarBackend
from pydantic import BaseModel

from {package}.backend import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_grammar_create(tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                         options: BaseModel | None) -> GrammarBackend:
    """A {class_name} for this tokenizer."""
    return {class_name}(tokenizer, vocab_size, stop_token_ids)
''',
    implementation='''"""{class_name}: the {name} grammar backend (choice lists only, to start from)."""

from __future__ import annotations

from typing import Any

import numpy as np
from frame.errors import InvalidSamplingError
from frame.interfaces.grammar import GrammarBackend, GrammarMatcher
from frame.sampling_params import StructuredOutputs


class {class_name}Matcher(GrammarMatcher):
    """A walk along the token sequences of the choices."""

    def __init__(self, choices: list[list[int]], stop_token_ids: list[int]) -> None:
        self.choices, self.stop = choices, stop_token_ids
        self.done: list[int] = []
        self.finished = False

    def _alive(self) -> list[list[int]]:
        return [c for c in self.choices if c[: len(self.done)] == self.done]

    def _next(self) -> set[int]:
        alive = self._alive()
        allowed = {{c[len(self.done)] for c in alive if len(c) > len(self.done)}}
        return allowed | (set(self.stop) if any(len(c) == len(self.done) for c in alive) else set())

    def accept(self, token_id: int) -> bool:
        if self.finished or token_id not in self._next():
            return False
        if token_id in self.stop and not any(len(c) > len(self.done) and c[len(self.done)] == token_id
                                             for c in self._alive()):
            self.finished = True
        else:
            self.done.append(token_id)
        return True

    def fill_bitmask(self, bitmask: np.ndarray) -> None:
        bitmask[:] = 0
        for token in self._next():
            bitmask[token // 32] |= np.int32(np.uint32(1 << (token % 32)).view(np.int32))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self.finished:
            self.finished, num_tokens = False, num_tokens - 1
        del self.done[len(self.done) - num_tokens :]

    def is_terminated(self) -> bool:
        return self.finished


class {class_name}(GrammarBackend):
    """Compiles choice lists into the token sequences of their strings; other constraints are refused."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        self.tokenizer, self.stop = tokenizer, stop_token_ids

    def compile(self, spec: StructuredOutputs) -> Any:
        if spec.choice is None:
            raise InvalidSamplingError(f"structured_outputs.{{spec.kind}} is not supported by this grammar backend; "
                                       "use choice.", param=f"structured_outputs.{{spec.kind}}")
        return [self.tokenizer(choice, add_special_tokens=False)["input_ids"] for choice in spec.choice]

    def matcher(self, compiled: Any) -> GrammarMatcher:
        return {class_name}Matcher(compiled, self.stop)
''',
    tests='''"""frame's grammar-backend conformance suite, run against this backend."""

import pytest
from frame.testing.grammar import GrammarConformance

from {package}.backend import {class_name}


class Test{class_name}(GrammarConformance):
    supported = ("choice",)

    @pytest.fixture
    def make_backend(self):
        return {class_name}
''',
    test_requires=(),
    select="`frame serve --grammar-backend {name}`, `grammar_backend: {name}` in a config file, or "
           "`LLM(grammar_backend=\"{name}\")`; requests choose a constraint with `response_format` or "
           "`structured_outputs`.",
    runs="In the engine core, on the host (masks are applied to the logits by the runner on any platform).",
)

TOOL_PARSER = KindTemplate(
    module="parser",
    plugin='''"""The {name} tool-call parser plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.tool_parser import ToolParser
from pydantic import BaseModel, ConfigDict

from {package}.parser import {class_name}

FRAME_API_VERSION = {api_version}


class {class_name}Options(BaseModel):
    """``--tool-parser-opt KEY=VALUE`` (``tool_parser_options`` in a config file): the tags around a call."""

    model_config = ConfigDict(extra="forbid")

    open_tag: str = "<call>"
    close_tag: str = "</call>"


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    """The parser's options, validated by frame when the server starts."""
    return {class_name}Options


@hookimpl
def frame_tool_parser_create(options: BaseModel | None) -> ToolParser:
    """A {class_name} for the configured tags."""
    chosen = options if isinstance(options, {class_name}Options) else {class_name}Options()
    return {class_name}(chosen.open_tag, chosen.close_tag)
''',
    implementation='''"""{class_name}: the {name} tool-call format, one ``<call>{{json}}</call>`` block per call."""

from __future__ import annotations

import json
import re

from frame.interfaces.tool_parser import ParsedText, ToolCall, ToolParser


class {class_name}(ToolParser):
    """Calls written as ``<call>{{"name": ..., "arguments": {{...}}}}</call>`` (the tags are options); change the
    format here."""

    def __init__(self, open_tag: str = "<call>", close_tag: str = "</call>") -> None:
        self.open = open_tag
        self.block = re.compile(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), re.S)

    def parse(self, text: str) -> ParsedText:
        calls, pieces, last = [], [], 0
        for match in self.block.finditer(text):
            try:
                data = json.loads(match.group(1))
                call = ToolCall(data["name"], json.dumps(data["arguments"]))
            except (ValueError, KeyError, TypeError):
                continue
            pieces.append(text[last : match.start()])
            calls.append(call)
            last = match.end()
        content = ("".join(pieces) + text[last:]).strip()
        return ParsedText(content or None, calls)

    def stream_safe_prefix(self, text: str) -> int:
        start = text.find(self.open)
        if start >= 0:
            return start
        for keep in range(min(len(self.open) - 1, len(text)), 0, -1):
            if self.open.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)
''',
    tests='''"""frame's tool-parser conformance suite, run against this parser."""

import json

import pytest
from frame.testing.tool_parser import ToolParserConformance

from {package} import plugin
from {package}.parser import {class_name}


class Test{class_name}(ToolParserConformance):
    plugin_module = plugin  # the suite also creates the parser through the plugin's hooks
    plugin_name = "{name}"

    @pytest.fixture
    def make_parser(self):
        return {class_name}

    def call_text(self, name, arguments):
        return "<call>" + json.dumps({{"name": name, "arguments": arguments}}) + "</call>"
''',
    test_requires=(),
    select="`frame serve --tool-parser {name}` (its options: `--tool-parser-opt 'open_tag=<fn>'`); chat "
           "completions with `tools` and `tool_choice: \"auto\"` then return the calls it finds as `tool_calls`.",
    runs="In the API server, on the generated text.",
)
