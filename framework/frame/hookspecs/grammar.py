"""Hooks of structured-output grammar backends (entry-point group ``frame.grammars``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.grammar import GrammarBackend


@hookspec
def frame_grammar_create(tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                         options: BaseModel | None) -> GrammarBackend:
    """Create the grammar backend for a model's tokenizer.

    Called by the engine core on the selected plugin (``--grammar-backend``, in-tree ``xgrammar``) the first time a
    request carries ``structured_outputs``, and by the API server to check a constraint before admitting it.
    ``tokenizer`` is the model's Hugging Face tokenizer, ``vocab_size`` the model's logits width (it may exceed
    the tokenizer's), ``stop_token_ids`` the tokens that end a completed grammar. Since API 2.
    """
