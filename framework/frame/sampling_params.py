"""SamplingParams: how one request's tokens are chosen, mirroring vLLM's offline API.

A msgspec Struct so that it crosses the process boundary to the engine core without pickle. Every field is
checked when the object is built; a bad value raises :class:`~frame.errors.InvalidSamplingError` naming the field.
"""

from __future__ import annotations

import msgspec

from frame.errors import InvalidSamplingError

#: Largest top-N logprobs a request may ask for (the server may lower it further).
MAX_LOGPROBS = 20


#: The constraint kinds given as a value (``json_object`` is a flag).
_KINDS = ("json", "regex", "choice", "grammar", "structural_tag")


class StructuredOutputs(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A constraint on a request's output, as vLLM's ``structured_outputs``: exactly one of

    - ``json``: a JSON schema (as JSON text), the output is a JSON value that satisfies it;
    - ``json_object``: True, the output is any JSON object;
    - ``regex``: the output matches this regular expression;
    - ``choice``: the output is one of these strings;
    - ``grammar``: the output is derived from this EBNF (GBNF) grammar's ``root`` rule;
    - ``structural_tag``: xgrammar's structural tag (as JSON text), as vLLM's field of that name; the server
      builds one for forced tool calls (a backend that cannot compile it refuses it naming the field).

    The grammar backend (``--grammar-backend``, in-tree ``xgrammar``) compiles it once per distinct constraint and
    masks every token that would leave it. A constraint it cannot compile is a usage error naming the field.
    """

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in _KINDS if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise InvalidSamplingError(
                "structured_outputs must set exactly one of json, json_object, regex, choice, grammar and "
                "structural_tag, got "
                f"{', '.join(given) or 'none'}.", param="structured_outputs")
        if self.choice is not None and (not self.choice or any(not c for c in self.choice)):
            raise InvalidSamplingError("structured_outputs.choice must list at least one non-empty string.",
                                       param="structured_outputs.choice")

    @property
    def kind(self) -> str:
        """Which constraint this is: ``json``, ``json_object``, ``regex``, ``choice``, ``grammar`` or
        ``structural_tag``."""
        for name in _KINDS:
            if getattr(self, name) is not None:
                return name
        return "json_object"

    def key(self) -> str:
        """A text that equals another's exactly when the constraints are the same (for compile caches)."""
        return msgspec.json.encode(self).decode()


class SamplingParams(msgspec.Struct, kw_only=True):
    """Sampling and stopping rules for one request.

    ``temperature == 0`` means greedy. ``top_k`` of ``None`` (or vLLM's ``-1``/``0``) means no top-k cut.
    ``logprobs=N`` returns the N most likely tokens' logprobs (and the sampled one's) at each step.
    ``prompt_logprobs=N`` (vLLM's meaning; None: off) returns, for every prompt position after the first, the
    logprob of the prompt's own token and the N most likely alternatives, computed in the prefill's forward pass.
    ``logit_bias`` maps token ids to a bias in [-100, 100] added to their logits before sampling (logprobs stay
    those of the raw distribution, as in vLLM).
    ``n`` completions are generated per prompt; each is an independent sequence in the engine that shares the
    prompt's KV through the prefix cache. ``num_speculative_tokens`` caps the drafts verified per step for this
    request when the engine speculates (0: none; None: the engine's count).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    num_speculative_tokens: int | None = None
    structured_outputs: StructuredOutputs | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.top_k is not None and self.top_k in (0, -1):
            self.top_k = None
        self._check()

    def _check(self) -> None:
        def bad(field: str, why: str) -> InvalidSamplingError:
            return InvalidSamplingError(f"{field} {why}.", param=field)

        if self.n < 1:
            raise bad("n", f"must be at least 1, got {self.n}")
        if not 0.0 <= self.temperature <= 100.0:
            raise bad("temperature", f"must be between 0 and 100, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise bad("top_k", f"must be a positive integer, or -1 to disable it, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be between 0 and 1, got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise bad(name, f"must be between -2 and 2, got {value}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise bad("max_tokens", f"must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise bad("min_tokens", f"must be at least 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.num_speculative_tokens is not None and not 0 <= self.num_speculative_tokens <= 16:
            raise bad("num_speculative_tokens", f"must be between 0 and 16, got {self.num_speculative_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise bad("logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise bad("prompt_logprobs", f"must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs}")
        if self.logit_bias:
            self._check_logit_bias()
        if any(not s for s in self.stop):
            raise bad("stop", "must not contain empty strings")
        if any(t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be non-negative token ids")

    def _check_logit_bias(self) -> None:
        assert self.logit_bias is not None
        token = next((t for t in self.logit_bias if t < 0), None)
        if token is not None:
            raise InvalidSamplingError(f"logit_bias holds token id {token}; token ids are non-negative.",
                                       param="logit_bias")
        token = next((t for t, b in self.logit_bias.items() if not -100.0 <= b <= 100.0), None)
        if token is not None:
            raise InvalidSamplingError(f"logit_bias of token {token} must be between -100 and 100, got "
                                       f"{self.logit_bias[token]}.", param="logit_bias")

    @property
    def greedy(self) -> bool:
        """True when the most likely token is always taken."""
        return self.temperature == 0.0 or self.top_k == 1


def check_speculative_tokens(asked: int | None, limit: int) -> None:
    """Refuse a request's ``num_speculative_tokens`` above what its engine drafts (0 without a proposer)."""
    if asked and asked > limit:
        raise InvalidSamplingError(
            f"num_speculative_tokens {asked} exceeds this engine's {limit}"
            + ("" if limit else " (it runs without speculative decoding; start it with --speculative-proposer)")
            + "; ask for fewer.", param="num_speculative_tokens")
