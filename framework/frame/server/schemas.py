"""Pydantic models of the request bodies: OpenAI's fields plus frame's (and vLLM's) sampling extensions.

Models are strict (``"0.5"`` is not a number, ``true`` is not an integer) and forbid unknown keys, so a typo is
a 400 naming the key rather than a silently ignored field. Every integer is bounded to what the engine carries and
every string must be valid Unicode (:mod:`frame.server.fields`); prompts and message lists may not be empty.
Sampling ranges live in SamplingParams and the operator's limits in :mod:`frame.server.checks`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue

from frame.server.fields import (
    Count,
    Logprobs,
    NonEmptyText,
    NonNegative,
    Priority,
    Seed,
    TemplateKwargs,
    Text,
    TokenId,
    TokenIds,
    TopK,
    check_template_values,
    integral,
)

#: The longest ``cache_salt`` a request may send.
MAX_CACHE_SALT_CHARS = 256


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage counts."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


JsonSchema = Annotated[dict[Text, JsonValue], AfterValidator(check_template_values)]


class JsonSchemaFormat(_Strict):
    """``response_format.json_schema``: OpenAI's named schema."""

    name: Annotated[Text, Field(min_length=1, max_length=64)]
    description: Text | None = None
    schema_: JsonSchema | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON that satisfies ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(_Strict):
    """vLLM's ``structured_outputs``: exactly one of a JSON schema (an object, or its JSON text), any JSON object,
    a regular expression, a list of choices, or an EBNF grammar."""

    json_: JsonSchema | Text | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: NonEmptyText | None = None
    choice: Annotated[list[NonEmptyText], Field(min_length=1)] | None = None
    grammar: NonEmptyText | None = None


class IgnoredFields(_Strict):
    """Fields of OpenAI's API that this server accepts and does not act on (clients send them by default; the
    list is in docs/serving.md). ``user`` and ``metadata`` are not logged; ``store`` matters only to
    ``/v1/responses``, which reads its own."""

    store: bool | None = None
    metadata: dict[Text, Text] | None = None
    service_tier: Text | None = None
    reasoning_effort: Text | None = None
    prompt_cache_key: Text | None = None
    prompt_cache_retention: Text | None = None
    safety_identifier: Text | None = None
    verbosity: Text | None = None
    user: Text | None = None
    modalities: list[Text] | None = None


class SamplingFields(IgnoredFields):
    """The fields completions and chat completions share."""

    model: Text | None = None
    n: Count = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: NonEmptyText | list[NonEmptyText] | None = None
    seed: Seed | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[Text, float] | None = None
    # Extensions (sent by the openai client through ``extra_body``).
    top_k: TopK | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: NonNegative = 0
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    cache_salt: Annotated[Text, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS)] | None = None
    priority: Priority = 0
    num_speculative_tokens: Annotated[int, Field(ge=0, le=16), BeforeValidator(integral)] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``. ``prompt``: text, token ids, or a list of either (a batch). ``max_tokens: 0``
    (with ``echo``) scores the prompt and generates nothing; ``prompt_logprobs`` is vLLM's extension."""

    prompt: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)] | TokenIds | \
        Annotated[list[TokenIds], Field(min_length=1)]
    max_tokens: NonNegative | None = 16
    logprobs: Logprobs | None = None
    echo: bool = False
    prompt_logprobs: Logprobs | None = None
    best_of: Count | None = None
    suffix: Text | None = None


class TextPart(_Strict):
    """A text part of a message's content."""

    type: Literal["text"]
    text: Text


class FunctionCall(_Strict):
    """The function an assistant message called: its name and its arguments' JSON text."""

    name: NonEmptyText
    arguments: Text


class MessageToolCall(_Strict):
    """A tool call of an earlier assistant message, sent back in the conversation."""

    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    """One message of a conversation. Content is text or a list of text parts; an assistant message may carry the
    tool calls it made, and a ``tool`` message answers one (``tool_call_id``)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_call_id: Text | None = None
    tool_calls: list[MessageToolCall] | None = None
    # What OpenAI and vLLM put in an assistant message and clients send back; accepted, not read.
    refusal: Text | None = None
    annotations: list[JsonValue] | None = None
    function_call: FunctionCall | None = None
    audio: dict[Text, JsonValue] | None = None
    reasoning_content: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Strict):
    """A function the model may call: its name, what it does, and its arguments' JSON schema."""

    name: Annotated[Text, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Text | None = None
    parameters: JsonSchema | None = None
    strict: bool | None = None


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: NonEmptyText


class NamedToolChoice(_Strict):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    tools: Annotated[list[ToolDefinition], Field(min_length=1, max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Logprobs | None = None
    add_generation_prompt: bool = True
    #: A Jinja template to use instead of the model's; refused unless ``--trust-request-chat-template``.
    chat_template: Text | None = None
    #: Extra template variables: plain JSON values, never arguments of the tokenizer.
    chat_template_kwargs: TemplateKwargs | None = None


class TokenizeRequest(_Strict):
    """``POST /tokenize``: text (``prompt``) or a conversation (``messages``, through the chat template)."""

    model: Text | None = None
    prompt: NonEmptyText | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    """``POST /detokenize``: token ids back to text."""

    model: Text | None = None
    tokens: list[TokenId] = Field(...)
