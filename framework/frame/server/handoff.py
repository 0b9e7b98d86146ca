"""Hand-off checks: what the server sends to a worker process must be data msgpack can carry.

JSON allows integers of any size and nesting of any depth; msgpack holds integers from -2**63 to 2**64 - 1, and
its encoder (like Python's own json) recurses once per level. A request value outside those bounds would make the
hand-off itself raise, after a worker was taken for it, so :func:`check_plain` walks the value first (without
recursion) and refuses it with a 400 naming the exact field: ``chat_template_kwargs.x``,
``tools[0].function.parameters.properties.n.maximum``, ``messages[1].tool_calls[0].function.arguments.n``.
"""

from __future__ import annotations

import re
from typing import Any

from frame.errors import FrameUsageError

#: What msgpack carries: a signed or an unsigned 64-bit integer.
MIN_INT, MAX_INT = -(2**63), 2**64 - 1
#: Deepest nesting of lists and objects passed to a worker (msgspec and Jinja recurse once per level).
MAX_DEPTH = 64
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _member(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    return f"{path}.{text}" if _NAME.fullmatch(text) else f"{path}[{text[:40]!r}]"


def _describe(value: int) -> str:
    bits = value.bit_length()
    return str(value) if bits <= 128 else f"a {bits}-bit integer"


def check_plain(value: Any, param: str) -> None:
    """Raise a usage error naming the first place in ``value`` (called ``param``) that holds an integer beyond 64
    bits, or nests deeper than :data:`MAX_DEPTH` levels."""
    stack: list[tuple[Any, str, int]] = [(value, param, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, bool) or item is None or isinstance(item, (str, float)):
            continue
        if isinstance(item, int):
            if not MIN_INT <= item <= MAX_INT:
                raise FrameUsageError(f"{path} holds {_describe(item)}, beyond the 64-bit integers this server "
                                      "passes on; send a smaller number, or the number as a string.", param=path)
            continue
        if isinstance(item, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise FrameUsageError(f"{path} nests lists and objects more than {MAX_DEPTH} levels deep; send a "
                                      "flatter value.", param=path)
            members = item.items() if isinstance(item, dict) else enumerate(item)
            # Pushed in reverse, so the first offending member in document order is the one named.
            stack.extend((member, _member(path, key), depth + 1) for key, member in reversed(list(members)))
