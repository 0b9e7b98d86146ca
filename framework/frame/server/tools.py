"""Tool calling for chat completions: ``tools`` and ``tool_choice`` in the OpenAI shape.

- ``none`` (or no tools): an ordinary completion.
- ``required`` and a named function: the output is constrained by the tools' own parameter schemas (one or more
  ``{"name", "parameters"}`` calls, ending after any complete one, or the named function's arguments), so any
  model returns calls whose arguments are valid for their tool; the JSON is then turned into ``tool_calls``.
- ``auto``: the model chooses, in its own format; the tool-call parser plugin (``--tool-parser``, in-tree
  ``hermes``) finds the calls in the text.

In every mode the tools go to the chat template (as ``tools``), and earlier assistant calls and ``tool`` answers
in the conversation go through it too.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from frame.errors import FrameUsageError
from frame.interfaces.tool_parser import MAX_JSON_CHARS, JSONBoundError, ParsedText, ToolCall, ToolParser, load_json
from frame.sampling_params import StructuredOutputs
from frame.server.handoff import MAX_DEPTH
from frame.server.schemas import ChatCompletionRequest, ChatMessage

log = logging.getLogger("frame.server")
Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    """How a chat request uses its tools: the mode, the named function, and the constraint it implies."""

    mode: Mode
    name: str | None = None
    constraint: StructuredOutputs | None = None

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")


def plan_tools(req: ChatCompletionRequest) -> ToolPlan:
    """Check ``tools``/``tool_choice`` and decide the mode; a usage error names the field."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise FrameUsageError("tool_choice needs tools; send the functions the model may call in tools.",
                                  param="tool_choice")
        return ToolPlan("none")
    if choice == "none":
        return ToolPlan("none")
    if choice is None or choice == "auto":
        return ToolPlan("auto")
    if (req.response_format is not None and req.response_format.type != "text") or req.structured_outputs:
        raise FrameUsageError("tool_choice required or a named function already constrains the output; drop "
                              "response_format and structured_outputs.", param="tool_choice")
    functions = {tool.function.name: tool.function for tool in req.tools}
    if choice == "required":
        return ToolPlan("required", constraint=required_calls(functions, req.parallel_tool_calls))
    name = choice.function.name  # type: ignore[union-attr]
    if name not in functions:
        raise FrameUsageError(f"tool_choice names the function '{name}', which is not in tools (they are: "
                              f"{', '.join(functions)}).", param="tool_choice")
    return ToolPlan("named", name, StructuredOutputs(json=json.dumps(functions[name].parameters or {"type": "object"})))


#: Between two forced calls; the output may also end after any complete call. A newline here made the bundled
#: model repeat its call line after line; after a comma it ends.
CALL_SEPARATOR = ", "


def required_calls(functions: dict[str, Any], parallel: bool) -> StructuredOutputs:
    """The constraint of ``tool_choice: "required"``: one or more ``{"name": ..., "parameters": {...}}`` objects
    (separated by commas), each valid for its own function's schema. The output may end after every complete
    call, so a model that has made the call it needs stops there rather than repeating it (which a JSON array,
    closed only by ``]``, invited); without ``parallel`` it ends after the first."""
    tags = [{"type": "tag", "begin": f'{{"name": {json.dumps(name)}, "parameters": ',
             "content": {"type": "json_schema", "json_schema": fn.parameters or {"type": "object"},
                         "max_whitespace_cnt": 1},
             "end": "}"} for name, fn in functions.items()]
    tag = {"type": "structural_tag", "format": {"type": "tags_with_separator", "tags": tags,
                                                "separator": CALL_SEPARATOR, "at_least_one": True,
                                                "stop_after_first": not parallel}}
    return StructuredOutputs(structural_tag=json.dumps(tag))


def _json_values(text: str) -> list[Any]:
    """The JSON values of ``text``, one after another, commas between (raises JSONDecodeError on a cut one)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and (text[at].isspace() or (text[at] == "," and values)):
            at += 1
        if at == len(text):
            return values
        value, at = decoder.raw_decode(text, at)
        values.append(value)


def template_tools(req: ChatCompletionRequest, plan: ToolPlan) -> list[dict[str, Any]] | None:
    """The tools as the chat template receives them (None in ``none`` mode)."""
    if plan.mode == "none" or not req.tools:
        return None
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in req.tools]


def template_message(message: ChatMessage, param: str = "messages") -> dict[str, Any]:
    """One message (``param``, for errors) as the chat template sees it, with its tool calls (arguments as
    objects, as templates expect) or the call it answers."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                           "content": message.text()}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments,
                                                                        f"{param}.tool_calls[{i}].function.arguments")}}
            for i, call in enumerate(message.tool_calls)]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str, param: str) -> Any:
    """Arguments JSON as an object; text that is not JSON goes to the template as text, but JSON past the
    bounds is the request's 400 (a template would recurse once per level, and parsing it costs the event loop)."""
    try:
        return load_json(text, max_depth=MAX_DEPTH)
    except JSONBoundError:
        raise FrameUsageError(f"{param} is JSON longer than {MAX_JSON_CHARS} characters or nested more than "
                              f"{MAX_DEPTH} levels deep, past what this server parses; send flatter, shorter "
                              "arguments.", param=param) from None
    except ValueError:  # not JSON: the template gets the text
        return text


def parse_output(plan: ToolPlan, text: str, parser: ToolParser | None) -> ParsedText:
    """The content and tool calls of a finished completion under ``plan``."""
    if plan.mode == "none":
        return ParsedText(text)
    if plan.mode == "auto":
        assert parser is not None
        try:
            return parser.parse(text)
        except Exception:  # a parser plugin's bug must not cost the client its completion: the text is content
            log.exception("the tool-call parser failed; the completion is returned as content")
            return ParsedText(text or None)
    try:
        values = _json_values(text)
    except (ValueError, RecursionError):  # cut off by max_tokens or nested too deep: the text stays visible
        return ParsedText(text or None)
    if not values:
        return ParsedText(None)
    if plan.mode == "named":
        return ParsedText(None, [ToolCall(plan.name or "", json.dumps(values[0], ensure_ascii=False))])
    return ParsedText(None, [ToolCall(call["name"], json.dumps(call["parameters"], ensure_ascii=False))
                             for call in values])


def stream_safe_prefix(parser: ToolParser, text: str) -> int:
    """The parser's safe prefix of ``text``; nothing while a failing parser cannot say (the whole text is then sent
    as content at the end, by :func:`parse_output`)."""
    try:
        return parser.stream_safe_prefix(text)
    except Exception:
        log.exception("the tool-call parser failed on streamed text")
        return 0


def openai_calls(calls: list[ToolCall], indexed: bool = False) -> list[dict[str, Any]]:
    """Calls in the OpenAI shape (``indexed``: as streamed deltas, each with its ``index``)."""
    out = []
    for index, call in enumerate(calls):
        item: dict[str, Any] = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments}}
        out.append({"index": index, **item} if indexed else item)
    return out


def finish_reason(reason: str | None, parsed: ParsedText) -> str | None:
    """``tool_calls`` when a completion that stopped on its own made calls."""
    return "tool_calls" if parsed.calls and reason == "stop" else reason
