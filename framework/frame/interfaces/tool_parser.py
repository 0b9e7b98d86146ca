"""ToolParser: finds the tool calls in a model's text, for chat completions with ``tools`` and ``tool_choice: auto``.

With ``auto`` the model decides whether to call a tool, in whatever format its chat template taught it (Hermes
and Qwen wrap a JSON object in ``<tool_call>`` tags, others differ); a parser plugin, chosen with
``--tool-parser``, turns the generated text into the OpenAI shape: the text outside the calls as ``content``, and
each call's function name and JSON arguments. ``required`` and a named function do not need a parser: the engine
constrains the output with a JSON schema instead.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

#: Deepest nesting of arrays and objects :func:`load_json` parses (Python's json recurses once per level).
MAX_JSON_DEPTH = 128
#: Longest text :func:`load_json` parses.
MAX_JSON_CHARS = 1 << 22
#: A JSON string (skipped whole) or a bracket: what the depth scan looks at.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)


class JSONBoundError(ValueError):
    """JSON text past :func:`load_json`'s size or depth bound (well formed or not): a server answering a client
    names the bound; a parser treats it as malformed text."""


def load_json(text: str, max_depth: int = MAX_JSON_DEPTH, max_chars: int = MAX_JSON_CHARS) -> Any:
    """``json.loads`` for text a model (or a client) wrote, bounded in size and depth: raises ValueError (a
    ``json.JSONDecodeError`` for malformed JSON) instead of a RecursionError or minutes of work, so a parser can
    treat too-deep or too-long text as it treats malformed text (:class:`JSONBoundError` tells them apart). The
    depth is measured without recursion first."""
    if len(text) > max_chars:
        raise JSONBoundError(f"the JSON text is {len(text)} characters long, over the limit of {max_chars}")
    depth = 0
    for token in _TOKENS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > max_depth:
                raise JSONBoundError(f"the JSON text nests more than {max_depth} levels deep")
        elif bracket in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except RecursionError:  # a depth the scan did not see (malformed strings): still just bad JSON
        raise JSONBoundError("the JSON text nests too deeply") from None


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as a JSON object's text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedText:
    """A completion split into the text a user reads (None when there is none) and the tool calls."""

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)


class ToolParser(ABC):
    """Stateless between requests; :meth:`stream_safe_prefix` lets the server stream content deltas without
    ever showing the beginning of a tool call as text."""

    @abstractmethod
    def parse(self, text: str) -> ParsedText:
        """Split a whole completion. Text that looks like a call but is not valid is left as content."""

    @abstractmethod
    def stream_safe_prefix(self, text: str) -> int:
        """How many leading characters of ``text`` (the completion so far) are certainly content, never part of a
        tool call, so they may be streamed now. The rest is held until more text decides it."""
