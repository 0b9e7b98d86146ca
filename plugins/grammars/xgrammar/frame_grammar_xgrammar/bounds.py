"""Counts xgrammar cannot represent, refused before it sees them.

xgrammar parses a repetition count (``a{4294967296}`` in a regex, ``"a"{0,4294967296}`` in EBNF, a JSON schema's
``pattern``) as a 64-bit integer and keeps it in 32 bits: 4294967296 wraps to 0, and the empty output then
satisfies ``a{4294967296}``. JSON schema's length and item counts (``maxLength``, ``maxProperties``) wrap the same
way where xgrammar does not check them itself. So every count past :data:`MAX_COUNT` is a usage error naming the
field, never a grammar that means something else.

Some counts xgrammar holds still cost too much: a JSON schema's ``pattern`` is expanded (``a{2000}`` compiles in
0.4 s, ``a{12000}`` in minutes), while a regex or an EBNF grammar keeps a repetition as one node (``a{10000000}``
compiles at once). So the backend's options lower the bounds: ``max_repeat`` (regexes and grammars),
``max_pattern_repeat`` (schema patterns) and ``max_schema_depth``, each named in the message that refuses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from frame.errors import InvalidSamplingError

#: The largest count xgrammar holds (a signed 32-bit integer).
MAX_COUNT = 2**31 - 1
#: Deepest nesting of a JSON schema compiled: xgrammar's time grows fast with depth (200 levels of ``items``
#: take seconds, 900 take minutes, in the server and again in the engine loop every request shares).
MAX_SCHEMA_DEPTH = 32
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_COUNT_KEYWORDS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                             "minContains", "maxContains"})


def repetition_counts(text: str, ebnf: bool = False) -> Iterator[str]:
    """The digits of each ``{m}``, ``{m,}`` and ``{m,n}`` quantifier in a regex (``ebnf``: an EBNF grammar, whose
    quoted strings are literal text), skipping escaped braces and character classes."""
    i, n, in_class, quote = 0, len(text), False, ""
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if quote:
            quote = "" if ch == quote else quote
        elif in_class:
            in_class = ch != "]"
        elif ebnf and ch in "\"'":
            quote = ch
        elif ch == "[":
            in_class = True
        elif ch == "{" and (match := _REPEAT.match(text, i)):
            yield from (count for count in match.groups() if count)
            i = match.end()
            continue
        i += 1


def _too_large(digits: str) -> bool:
    return len(digits) > len(str(MAX_COUNT)) or int(digits) > MAX_COUNT


def check_repetitions(text: str, field: str, ebnf: bool = False, what: str | None = None,
                      limit: int = MAX_COUNT, option: str = "max_repeat") -> None:
    """Raise a usage error naming ``field`` when ``text`` (``what`` of it, for the message) repeats something more
    than ``limit`` times (at most :data:`MAX_COUNT`; ``option`` is the backend option that sets it)."""
    for digits in repetition_counts(text, ebnf):
        if _too_large(digits) or int(digits) > limit:
            shown = digits if len(digits) <= 30 else f"{digits[:12]}... ({len(digits)} digits)"
            if limit >= MAX_COUNT:
                reason = f"more than the grammar backend can count ({MAX_COUNT})"
            else:
                reason = f"over this server's limit of {limit} (--grammar-opt {option}=N)"
            raise InvalidSamplingError(f"{what or field} repeats {shown} times, {reason}; use a smaller count, or "
                                       "'*' / '+' for no bound.", param=field)


def check_schema_counts(schema: Any, field: str, max_depth: int = MAX_SCHEMA_DEPTH,
                        max_pattern_repeat: int = MAX_COUNT) -> None:
    """The same for a JSON schema: its ``pattern`` regexes (repetitions up to ``max_pattern_repeat``) and its length
    and item counts, at any depth; and the schema nests at most ``max_depth`` levels."""
    stack = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)) and depth >= max_depth:
            raise InvalidSamplingError(f"{field} nests more than {max_depth} levels deep, over this server's limit "
                                       "(--grammar-opt max_schema_depth=N); send a flatter schema.", param=field)
        if isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key == "pattern" and isinstance(value, str):
                    check_repetitions(value, field, what=f"A pattern in {field}", limit=max_pattern_repeat,
                                      option="max_pattern_repeat")
                elif key in _COUNT_KEYWORDS and isinstance(value, int) and not isinstance(value, bool) \
                        and value > MAX_COUNT:
                    raise InvalidSamplingError(f"{field} has {key} {value}, more than the grammar backend can "
                                               f"count ({MAX_COUNT}); use a smaller {key} or leave it out.",
                                               param=field)
                else:
                    stack.append((value, depth + 1))
