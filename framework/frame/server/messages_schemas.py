"""Pydantic models of ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's Messages API).

Text, ``tool_use`` and ``tool_result`` content blocks; tools with their ``input_schema``; ``tool_choice``
``auto``, ``any``, ``tool`` and ``none``. Strict like the OpenAI schemas: an unknown key is a 400 naming it.
``output_config.format`` (a JSON schema) constrains the output; ``cache_control``, ``citations``, ``metadata``,
``service_tier``, ``thinking``, ``output_config.effort``, ``inference_geo``, ``speed``, ``user_profile_id``,
``workspace_id`` and ``diagnostics`` are accepted and not acted on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from frame.server.fields import Count, NonEmptyText, Text, TopK
from frame.server.schemas import JsonSchema


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class _Block(_Strict):
    cache_control: dict[Text, JsonValue] | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: Text
    citations: list[JsonValue] | None = None


class ToolUseBlock(_Block):
    """A tool call an earlier assistant turn made, sent back."""

    type: Literal["tool_use"]
    id: NonEmptyText
    name: NonEmptyText
    input: dict[Text, JsonValue]
    caller: JsonValue = None
    toolset_name: Text | None = None


class ToolResultBlock(_Block):
    """What the client's tool returned for ``tool_use_id``."""

    type: Literal["tool_result"]
    tool_use_id: NonEmptyText
    content: Text | list[TextBlock] | None = None
    is_error: bool | None = None
    toolset_name: Text | None = None


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class AnthropicMessage(_Strict):
    role: Literal["user", "assistant"]
    content: Text | Annotated[list[Block], Field(min_length=1)]


class AnthropicTool(_Strict):
    """A client tool: its name, what it does and the JSON schema of its input."""

    name: Annotated[Text, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Text | None = None
    input_schema: JsonSchema
    type: Literal["custom"] | None = None
    strict: bool | None = None
    # Accepted, not acted on.
    cache_control: dict[Text, JsonValue] | None = None
    allowed_callers: list[Text] | None = None
    defer_loading: bool | None = None
    eager_input_streaming: bool | None = None
    input_examples: list[JsonValue] | None = None


class AnthropicToolChoice(_Strict):
    """``auto`` (the model decides), ``any`` (some tool), ``tool`` (the one ``name``d) or ``none``."""

    type: Literal["auto", "any", "tool", "none"]
    name: NonEmptyText | None = None
    disable_parallel_tool_use: bool | None = None


class JsonOutputFormat(_Strict):
    """``output_config.format``: the output is JSON that satisfies ``schema``."""

    type: Literal["json_schema"]
    schema_: JsonSchema = Field(alias="schema")


class OutputConfig(_Strict):
    """``output_config``: the output's format (acted on) and the effort (accepted, not acted on)."""

    format: JsonOutputFormat | None = None
    effort: Text | None = None


class CountTokensRequest(_Strict):
    """``POST /v1/messages/count_tokens``: what the prompt of a Messages request would count."""

    model: Text
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: Text | list[TextBlock] | None = None
    tools: Annotated[list[AnthropicTool], Field(max_length=128)] | None = None
    tool_choice: AnthropicToolChoice | None = None
    output_config: OutputConfig | None = None
    # Accepted, not acted on.
    thinking: dict[Text, JsonValue] | None = None
    cache_control: dict[Text, JsonValue] | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``."""

    max_tokens: Count
    stop_sequences: list[NonEmptyText] | None = None
    stream: bool = False
    # Older clients send these sampling fields (vLLM takes them too); today's SDK sends them through extra_body.
    temperature: float | None = None
    top_p: float | None = None
    top_k: TopK | None = None
    # Accepted, not acted on.
    metadata: dict[Text, JsonValue] | None = None
    service_tier: Text | None = None
    inference_geo: Text | None = None
    speed: Text | None = None
    user_profile_id: Text | None = None
    workspace_id: Text | None = None
    diagnostics: dict[Text, JsonValue] | None = None
