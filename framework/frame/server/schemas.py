"""Pydantic models of the request bodies: OpenAI's fields plus frame's (and vLLM's) sampling extensions.

Models are strict (``"0.5"`` is not a number, ``true`` is not an integer) and forbid unknown keys, so a typo is
a 400 naming the key rather than a silently ignored field. Range checks live in SamplingParams and the server's
limits; these models check only shapes and types.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage counts."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(_Strict):
    """The fields completions and chat completions share."""

    model: str | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions (sent by the openai client through ``extra_body``).
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    cache_salt: str | None = None
    priority: int = 0


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``. ``prompt``: text, token ids, or a list of either (a batch)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class TextPart(_Strict):
    """A text part of a message's content."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """One message of a conversation. Content is text or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, object] | None = None


class TokenizeRequest(_Strict):
    """``POST /tokenize``: text (``prompt``) or a conversation (``messages``, through the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    """``POST /detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[int] = Field(...)
