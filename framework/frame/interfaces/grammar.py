"""GrammarBackend: compiles structured-output constraints and tracks each request's place in its grammar.

The engine core keeps one :class:`GrammarMatcher` per constrained request. Before a step it asks each matcher
for the tokens allowed next (:meth:`GrammarMatcher.fill_bitmask`, one row per position the step samples, drafts
included), sends the packed masks with the step plan, and the runner sets every other token's logit to -inf
before sampling; after the step it feeds the sampled tokens back (:meth:`GrammarMatcher.accept`). A backend only
compiles and matches: masks are int32 words, bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed
(the layout xgrammar, llguidance and vLLM share).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from frame.sampling_params import StructuredOutputs


class GrammarMatcher(ABC):
    """One request's position in its compiled grammar."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False (state unchanged) when the grammar does not allow it here."""

    @abstractmethod
    def fill_bitmask(self, bitmask: np.ndarray) -> None:
        """Write the tokens allowed next into ``bitmask`` (int32 ``[ceil(vocab / 32)]``, overwritten)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (drafts checked ahead of verification)."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once the grammar is complete and its stop token accepted: nothing more may follow."""


class GrammarBackend(ABC):
    """Compiles constraints for one tokenizer; compiled grammars are cached by the engine (one per distinct
    constraint) and shared by every request that uses it."""

    @abstractmethod
    def compile(self, spec: StructuredOutputs) -> Any:
        """The compiled grammar of ``spec``. Raise ``frame.errors.InvalidSamplingError`` naming the field
        (``structured_outputs.json``, ``.regex``, ``.grammar`` ...) and why, for a constraint it cannot compile."""

    @abstractmethod
    def matcher(self, compiled: Any) -> GrammarMatcher:
        """A fresh matcher at the start of ``compiled``."""
