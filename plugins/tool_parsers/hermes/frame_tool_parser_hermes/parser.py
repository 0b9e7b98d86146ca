"""HermesToolParser: tool calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

The format of NousResearch's Hermes models, also used by Qwen 2/2.5/3 and many fine-tunes. Each block holds one
JSON object with the function's ``name`` and its ``arguments`` (an object; some models write ``parameters``).
Text outside the blocks is the message's content. A block whose JSON does not parse, or that lacks a name, stays
content: a malformed call is shown, never silently dropped. That includes JSON nested deeper than
:data:`~frame.interfaces.tool_parser.MAX_JSON_DEPTH` levels or longer than its size limit (parsed with the core's
bounded :func:`~frame.interfaces.tool_parser.load_json`): the text comes back as content, as vLLM's hermes parser
returns text it cannot parse, never an error.
"""

from __future__ import annotations

import json
import re

from frame.interfaces.tool_parser import ParsedText, ToolCall, ToolParser, load_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.S)


def _call(body: str) -> ToolCall | None:
    try:
        data = load_json(body)
    except ValueError:  # malformed, too deep or too long: the block stays content
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # some models put the arguments' JSON text in a string
        try:
            arguments = load_json(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(data["name"], json.dumps(arguments, ensure_ascii=False))


class HermesToolParser(ToolParser):
    """Splits a completion at its ``<tool_call>`` blocks."""

    def parse(self, text: str) -> ParsedText:
        calls: list[ToolCall] = []
        content: list[str] = []
        last = 0
        for match in _BLOCK.finditer(text):
            call = _call(match.group(1).strip())
            if call is None:
                continue
            content.append(text[last : match.start()])
            calls.append(call)
            last = match.end()
        content.append(text[last:])
        rest = "".join(content).strip()
        return ParsedText(rest or None, calls)

    def stream_safe_prefix(self, text: str) -> int:
        start = text.find(OPEN)
        if start >= 0:
            return start
        # The text may end with the first characters of "<tool_call>": hold those back until they are decided.
        for keep in range(min(len(OPEN) - 1, len(text)), 0, -1):
            if OPEN.startswith(text[-keep:]):
                return len(text) - keep
        return len(text)
