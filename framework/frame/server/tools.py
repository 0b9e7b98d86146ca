"""Tool calling for chat completions: ``tools`` and ``tool_choice`` in the OpenAI shape.

- ``none`` (or no tools): an ordinary completion.
- ``required`` and a named function: the output is constrained by a JSON schema built from the tools' own
  parameter schemas (an array of ``{"name", "parameters"}`` calls, or the named function's arguments), so any model
  returns calls whose arguments are valid for their tool; the JSON is then turned into ``tool_calls``.
- ``auto``: the model chooses, in its own format; the tool-call parser plugin (``--tool-parser``, in-tree
  ``hermes``) finds the calls in the text.

In every mode the tools go to the chat template (as ``tools``), and earlier assistant calls and ``tool`` answers
in the conversation go through it too.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from frame.errors import FrameUsageError
from frame.interfaces.tool_parser import ParsedText, ToolCall, ToolParser
from frame.sampling_params import StructuredOutputs
from frame.server.schemas import ChatCompletionRequest, ChatMessage

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
        calls = [{"type": "object", "properties": {"name": {"const": name},
                                                   "parameters": fn.parameters or {"type": "object"}},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, fn in functions.items()]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not req.parallel_tool_calls:
            schema["maxItems"] = 1
        return ToolPlan("required", constraint=StructuredOutputs(json=json.dumps(schema)))
    name = choice.function.name  # type: ignore[union-attr]
    if name not in functions:
        raise FrameUsageError(f"tool_choice names the function '{name}', which is not in tools (they are: "
                              f"{', '.join(functions)}).", param="tool_choice")
    return ToolPlan("named", name, StructuredOutputs(json=json.dumps(functions[name].parameters or {"type": "object"})))


def template_tools(req: ChatCompletionRequest, plan: ToolPlan) -> list[dict[str, Any]] | None:
    """The tools as the chat template receives them (None in ``none`` mode)."""
    if plan.mode == "none" or not req.tools:
        return None
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in req.tools]


def template_message(message: ChatMessage) -> dict[str, Any]:
    """One message as the chat template sees it, with its tool calls (arguments as objects, as templates
    expect) or the call it answers."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                           "content": message.text()}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)}}
            for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_output(plan: ToolPlan, text: str, parser: ToolParser | None) -> ParsedText:
    """The content and tool calls of a finished completion under ``plan``."""
    if plan.mode == "none":
        return ParsedText(text)
    if plan.mode == "auto":
        assert parser is not None
        return parser.parse(text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:  # cut off by max_tokens: no calls, the text stays visible
        return ParsedText(text or None)
    if plan.mode == "named":
        return ParsedText(None, [ToolCall(plan.name or "", json.dumps(data, ensure_ascii=False))])
    return ParsedText(None, [ToolCall(call["name"], json.dumps(call["parameters"], ensure_ascii=False))
                             for call in data])


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
