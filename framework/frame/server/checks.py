"""The server's checks: everything about a request is verified here, before anything reaches the engine core.

Sampling ranges are SamplingParams' own (it raises InvalidSamplingError naming the field); this module adds the
server's limits (n, max_tokens, logprobs, stop lists and their length), the seed of the last of ``n`` completions,
the model name, the cache salt, token ids inside the vocabulary and the context length, with the same message the
engine core's ``check_request`` gives.
"""

from __future__ import annotations

from frame.errors import FrameUsageError, InvalidSamplingError, PromptTooLongError
from frame.sampling_params import SamplingParams, StructuredOutputs, check_speculative_tokens
from frame.server.errors import ServerError
from frame.server.fields import UINT64_MAX
from frame.server.schemas import MAX_CACHE_SALT_CHARS, SamplingFields
from frame.server.settings import ServerLimits


def check_model(requested: str | None, served: list[str]) -> None:
    """A request may omit ``model``; a name that is not served is a 404."""
    if requested is not None and requested not in served:
        raise ServerError(f"The model '{requested}' does not exist; this server serves: {', '.join(served)}.",
                          status=404, code="model_not_found", param="model")


def check_cache_salt(salt: str | None) -> None:
    if salt is None:
        return
    if not salt or len(salt) > MAX_CACHE_SALT_CHARS or not salt.isprintable():
        raise InvalidSamplingError(
            f"cache_salt must be 1 to {MAX_CACHE_SALT_CHARS} printable characters, got {len(salt)} characters"
            f"{'' if salt.isprintable() else ' with non-printable ones'}.", param="cache_salt")


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise FrameUsageError(f"{param} holds token id {bad}, outside the vocabulary [0, {vocab_size}).",
                              param=param)


def check_length(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """What EngineCore.check_request checks, with its message, so the server refuses before the engine sees it."""
    if num_prompt_tokens == 0:
        raise PromptTooLongError("The prompt is empty; send at least one token.", param="prompt")
    asked = max_tokens or 1
    if num_prompt_tokens + asked > max_model_len:
        raise PromptTooLongError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has {num_prompt_tokens} "
            f"tokens and max_tokens asks for {asked} more; shorten the prompt or lower max_tokens.",
            param="max_tokens" if num_prompt_tokens < max_model_len else "prompt",
        )


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token id text -> bias in [-100, 100]) as SamplingParams takes it; one-sentence
    400s for a key that is not a token id of this vocabulary or a bias out of range."""
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else None
        if token is None or token >= vocab_size:
            raise InvalidSamplingError(f"logit_bias key {key!r} is not a token id of this model's vocabulary "
                                       f"[0, {vocab_size}); use token ids written as decimal strings.",
                                       param="logit_bias")
        if not -100.0 <= value <= 100.0:
            raise InvalidSamplingError(f"logit_bias of token {key} is {value}; a bias must be between -100 and 100.",
                                       param="logit_bias")
        out[token] = float(value)
    return out


def _limit(value: int | None, limit: int | None, param: str, what: str) -> None:
    if value is not None and limit is not None and value > limit:
        raise ServerError(f"{param} is {value}, over this server's limit of {limit} {what}.",
                          status=400, code="limit_exceeded", param=param)


def sampling_params(req: SamplingFields, limits: ServerLimits, *, max_tokens: int | None,
                    logprobs: int | None, vocab_size: int, max_speculative_tokens: int = 0,
                    structured_outputs: StructuredOutputs | None = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """SamplingParams from a request's fields; raises a usage error (400) for anything out of range."""
    bias = logit_bias(req.logit_bias, vocab_size)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    _limit(req.n, limits.max_n, "n", "completions per request")
    _limit(max_tokens, limits.max_tokens, "max_tokens", "tokens")
    _limit(logprobs, limits.max_logprobs, "logprobs", "top logprobs")
    _limit(prompt_logprobs, limits.max_logprobs, "prompt_logprobs", "top logprobs")
    _limit(len(stop), limits.max_stop, "stop", "stop strings")
    stop_chars = sum(len(s) for s in stop)
    if stop_chars > limits.max_stop_chars:
        raise ServerError(f"stop holds {stop_chars} characters in all, over this server's limit of "
                          f"{limits.max_stop_chars} (--max-stop-chars); send shorter stop strings.",
                          status=400, code="limit_exceeded", param="stop")
    if req.seed is not None and req.seed + req.n - 1 > UINT64_MAX:
        raise InvalidSamplingError(f"seed {req.seed} with n={req.n} gives the last completion seed "
                                   f"{req.seed + req.n - 1}, past 64 bits; send a seed of at most "
                                   f"{UINT64_MAX - req.n + 1}.", param="seed")
    _limit(len(req.stop_token_ids or ()), limits.max_stop_token_ids, "stop_token_ids", "stop token ids")
    if req.stop_token_ids:
        check_token_ids(req.stop_token_ids, vocab_size, "stop_token_ids")
    check_cache_salt(req.cache_salt)
    check_speculative_tokens(req.num_speculative_tokens, max_speculative_tokens)
    try:
        return SamplingParams(
            n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=req.top_k,
            min_p=0.0 if req.min_p is None else req.min_p, seed=req.seed,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            max_tokens=max_tokens, min_tokens=req.min_tokens, stop=stop,
            stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens, num_speculative_tokens=req.num_speculative_tokens,
            structured_outputs=structured_outputs, prompt_logprobs=prompt_logprobs, logit_bias=bias,
        )
    except (TypeError, ValueError) as err:  # msgspec reports a wrong type as TypeError
        raise InvalidSamplingError(f"Invalid sampling parameters: {err}.") from None
