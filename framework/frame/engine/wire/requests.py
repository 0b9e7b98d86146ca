"""Messages between an engine client (offline LLM, API server) and the engine core.

msgspec Structs: they cross the process boundary as msgpack over ZeroMQ, never pickle. The same types are used
in-process so both engine modes behave alike.
"""

from __future__ import annotations

import msgspec

from frame.errors import PromptTooLongError
from frame.sampling_params import SamplingParams, check_speculative_tokens


class EngineRequest(msgspec.Struct, kw_only=True):
    """One sequence to generate. A request with ``n > 1`` is sent as ``n`` EngineRequests by the client."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Logprob of the sampled (or prompt) token and the top-N alternatives at one position; ``rank`` is the
    token's 1-based rank in the distribution where it was computed (prompt logprobs), else None."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]
    rank: int | None = None


class EngineOutput(msgspec.Struct, kw_only=True):
    """New tokens of one sequence from one step (or its end).

    ``finish_reason`` is ``"stop"``, ``"length"`` or ``"abort"`` on the sequence's last output, else None;
    ``stop_reason`` is the stop token id when a stop token ended it. ``prompt_logprobs`` (on a request's first
    output, when it asked for them) score its prompt tokens from the second on.
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class EngineStats(msgspec.Struct, kw_only=True):
    """A snapshot of the engine core's gauges and counters (for /metrics and benchmarks).

    ``comm_seconds``: time the driver rank spent in tensor-parallel collectives, over every step.
    ``spec_*``: speculative decoding's drafts verified, drafts kept, and steps that verified drafts.
    ``prefix_cache_resets``: resets that emptied the prefix cache (one asked while requests hold blocks does not).
    ``grammar_*``: the compiled-grammar cache (entries, bytes, evictions) and the seconds spent compiling.
    ``kv_groups``: the model's KV groups (``"full"`` or ``"window W"``, :mod:`frame.interfaces.kv_groups`), and
    ``group_blocks_in_use`` / ``peak_group_blocks_in_use`` the blocks each holds for live requests."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_blocks: int = 0
    blocks_in_use: int = 0
    peak_blocks_in_use: int = 0
    prefix_queries: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    evictions: int = 0
    preemptions: int = 0
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0
    steps: int = 0
    comm_seconds: float = 0.0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verifications: int = 0
    prefix_cache_resets: int = 0
    grammar_cache_entries: int = 0
    grammar_cache_bytes: int = 0
    grammar_cache_evictions: int = 0
    grammar_compile_seconds: float = 0.0
    kv_groups: list[str] = []
    group_blocks_in_use: list[int] = []
    peak_group_blocks_in_use: list[int] = []

    @property
    def spec_acceptance_rate(self) -> float:
        """Drafts kept / drafts verified (speculative decoding; 0 without)."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens a verification step emits on average: the drafts kept plus the target's own."""
        return 1 + self.spec_accepted_tokens / self.spec_verifications if self.spec_verifications else 0.0


def check_request(req: EngineRequest, max_model_len: int, max_speculative_tokens: int) -> None:
    """Raise a usage error for a request that could never run on an engine of this context length."""
    n = len(req.prompt_token_ids)
    if n == 0:
        raise PromptTooLongError("The prompt is empty; send at least one token.", param="prompt")
    check_speculative_tokens(req.params.num_speculative_tokens, max_speculative_tokens)
    max_tokens = req.params.max_tokens or 1
    if n + max_tokens > max_model_len:
        raise PromptTooLongError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has {n} tokens "
            f"and max_tokens asks for {max_tokens} more; shorten the prompt or lower max_tokens.",
            param="max_tokens" if n < max_model_len else "prompt",
        )
