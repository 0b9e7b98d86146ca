"""Workload: a named, seeded generator of benchmark requests, the object a workload plugin offers.

The contract of the ``workload`` plugin kind (hook ``frame_workload_list``, suite
:class:`frame.testing.workload.WorkloadConformance`). A workload turns ``(tokenizer, seed, size parameters)``
into a list of :class:`WorkloadRequest`. The same arguments always give the same requests, so every cell of an
experiment and both systems of a comparison run on identical prompts. Nothing is downloaded: prompt tokens are
drawn with a seeded RNG from the tokenizer's ordinary (non-special) vocabulary.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from frame.errors import ConfigError
from frame.sampling_params import SamplingParams

_MARKER = "FRAMEBENCHMARKERTEXT"


@dataclass(frozen=True)
class WorkloadRequest:
    """One request of a workload.

    ``wave``: requests of wave ``k`` are submitted only after every request of earlier waves finished (a
    multi-turn chat's turn ``k`` follows turn ``k-1``); within a wave all are submitted at once.
    """

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    wave: int = 0
    priority: int = 0
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a workload request needs at least one prompt token")
        if self.wave < 0:
            raise ValueError(f"wave must be >= 0, got {self.wave}")


@dataclass
class WorkloadContext:
    """What a workload's builder draws from: the seeded RNG and the tokenizer's ordinary token ids."""

    tokenizer: Any
    rng: random.Random
    _vocab: list[int] = field(default_factory=list, repr=False)

    @property
    def vocab(self) -> list[int]:
        if not self._vocab:
            special = set(self.tokenizer.all_special_ids)
            self._vocab = [i for i in range(len(self.tokenizer)) if i not in special]
        return self._vocab

    def tokens(self, n: int) -> list[int]:
        """``n`` token ids drawn uniformly from the ordinary vocabulary."""
        return self.rng.choices(self.vocab, k=n)

    def length(self, spec: int | Sequence[int]) -> int:
        """A length: ``spec`` itself, or uniform in ``[lo, hi]`` when it is a pair."""
        if isinstance(spec, int):
            return spec
        lo, hi = spec
        return self.rng.randint(lo, hi)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def chat_frame(self) -> tuple[list[int], list[int]]:
        """Token ids the chat template puts before and after one user message (empty without a template)."""
        if not getattr(self.tokenizer, "chat_template", None):
            return [], []
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": _MARKER}],
                                                  add_generation_prompt=True, tokenize=False)
        head, _, tail = text.partition(_MARKER)
        return self.encode(head), self.encode(tail)


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy decoding of exactly ``max_tokens`` tokens (``ignore_eos``), so every system does the same work."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


Builder = Callable[[WorkloadContext, dict[str, Any]], list[WorkloadRequest]]


@dataclass(frozen=True)
class Workload:
    """A named, seeded generator of requests.

    ``name`` is what ``frame bench --workload`` and an experiment's ``workloads:`` entry select, unique among every
    installed workload; ``description`` is one line on its shape; ``defaults`` names every size parameter and its
    default (``--workload-opt KEY=VALUE`` and an experiment's ``params:`` override them; no other key is taken);
    ``param_docs`` says in a few words what each parameter of ``defaults`` means. ``build`` makes the requests from
    a :class:`WorkloadContext` and the merged parameters: it must draw every random choice from ``ctx.rng`` (the
    same seed then gives the same requests) and tokens only from ``ctx.tokens``/``ctx.encode`` (ids the tokenizer
    has). It is called by :meth:`generate` only, never when the workload is listed.
    """

    name: str
    description: str
    defaults: Mapping[str, Any]
    build: Builder
    param_docs: Mapping[str, str] = field(default_factory=dict)

    def generate(self, tokenizer: Any, seed: int = 0, **params: Any) -> list[WorkloadRequest]:
        """The requests for this seed and these parameters (unknown parameter names are a ConfigError)."""
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise ConfigError(
                f"Workload '{self.name}' has no parameter {', '.join(repr(u) for u in unknown)}; "
                f"its parameters are: {', '.join(self.defaults)}.",
                param="workload",
            )
        ctx = WorkloadContext(tokenizer, random.Random(f"{self.name}:{seed}"))
        requests = self.build(ctx, {**self.defaults, **params})
        if not requests:
            raise ConfigError(f"Workload '{self.name}' produced no requests with {params}.", param="workload")
        return requests
