"""Results of generation, shaped like vLLM's so that a vLLM script runs by changing its import."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """A token's log probability, its 1-based rank in the distribution (None if unknown) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


#: One position's logprobs: the sampled token and the top-N alternatives, by token id.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One of the ``n`` completions of a request."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its completions. ``num_cached_tokens``: prompt tokens reused from the prefix cache.

    ``prompt_logprobs`` (when the request set ``prompt_logprobs``): one entry per prompt token, None for the first
    (nothing precedes it), then the token's logprob and the top alternatives, as vLLM's."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
