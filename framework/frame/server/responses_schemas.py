"""Pydantic models of ``POST /v1/responses`` (OpenAI's Responses API): the input items, tools and text format.

As strict as the chat schemas: unknown keys are a 400 naming them, while the standard fields this server does not
act on are accepted (:class:`~frame.server.schemas.IgnoredFields`, plus the Responses API's own: ``reasoning``,
``include``, ``truncation``, ``max_tool_calls``, ``stream_options``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from frame.server.fields import Count, NonEmptyText, Seed, Text
from frame.server.schemas import FunctionDefinition, IgnoredFields, JsonSchema


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class ContentPart(_Strict):
    """A text part of an input message (``input_text``), or of an earlier output sent back (``output_text``)."""

    type: Literal["input_text", "output_text"]
    text: Text
    annotations: list[JsonValue] | None = None
    logprobs: list[JsonValue] | None = None


class MessageItem(_Strict):
    """A message: ``{"role", "content"}``, or an earlier response's output message sent back (``id``, ``status``)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Text | list[ContentPart]
    id: Text | None = None
    status: Text | None = None


class FunctionCallItem(_Strict):
    """A function call an earlier response made, sent back."""

    type: Literal["function_call"]
    call_id: NonEmptyText
    name: NonEmptyText
    arguments: Text
    id: Text | None = None
    status: Text | None = None


class FunctionCallOutputItem(_Strict):
    """What the client's function returned, for the call ``call_id``."""

    type: Literal["function_call_output"]
    call_id: NonEmptyText
    output: Text | list[ContentPart]
    id: Text | None = None
    status: Text | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem


class FunctionTool(FunctionDefinition):
    """A function the model may call (the Responses API's flat shape: chat's definition, no ``function`` wrapper)."""

    type: Literal["function"]


class NamedFunctionChoice(_Strict):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    name: NonEmptyText


class TextFormat(_Strict):
    """``text.format``: plain text, any JSON object, or JSON satisfying ``schema`` (named, as in chat)."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[Text, Field(min_length=1, max_length=64)] | None = None
    description: Text | None = None
    schema_: JsonSchema | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Strict):
    """``text``: the output's format, and its verbosity (accepted, not acted on)."""

    format: TextFormat | None = None
    verbosity: Text | None = None


class ResponsesStreamOptions(_Strict):
    """``stream_options``: OpenAI's obfuscation padding, which this server never adds."""

    include_obfuscation: bool | None = None


class ResponsesRequest(IgnoredFields):
    """``POST /v1/responses``."""

    model: Text | None = None
    input: NonEmptyText | Annotated[list[InputItem], Field(min_length=1)]
    instructions: Text | None = None
    previous_response_id: NonEmptyText | None = None
    max_output_tokens: Count | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: Seed | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    # The Responses API's own fields this server does not act on.
    reasoning: dict[Text, JsonValue] | None = None
    include: list[Text] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: Count | None = None
    background: bool | None = None
