"""Pydantic models of the request bodies: OpenAI's fields plus frame's (and vLLM's) sampling extensions.

Models are strict (``"0.5"`` is not a number, ``true`` is not an integer) and forbid unknown keys, so a typo is
a 400 naming the key rather than a silently ignored field. Every integer is bounded to what the engine carries and
every string must be valid Unicode (:mod:`frame.server.fields`); prompts and message lists may not be empty.
Sampling ranges live in SamplingParams and the operator's limits in :mod:`frame.server.checks`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

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
)

#: The longest ``cache_salt`` a request may send.
MAX_CACHE_SALT_CHARS = 256


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage counts."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(_Strict):
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
    user: Text | None = None
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


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``. ``prompt``: text, token ids, or a list of either (a batch)."""

    prompt: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)] | TokenIds | \
        Annotated[list[TokenIds], Field(min_length=1)]
    max_tokens: Count | None = 16
    logprobs: Logprobs | None = None
    echo: bool = False
    best_of: Count | None = None
    suffix: Text | None = None


class TextPart(_Strict):
    """A text part of a message's content."""

    type: Literal["text"]
    text: Text


class ChatMessage(_Strict):
    """One message of a conversation. Content is text or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_call_id: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

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
