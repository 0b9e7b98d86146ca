"""Hook implementations of the xgrammar grammar backend plugin."""

from __future__ import annotations

from typing import Any

from frame.hookspecs import hookimpl
from frame.interfaces.grammar import GrammarBackend
from pydantic import BaseModel

from frame_grammar_xgrammar.backend import XGrammarBackend, XGrammarOptions

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    return XGrammarOptions


@hookimpl
def frame_grammar_create(tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                         options: BaseModel | None) -> GrammarBackend:
    return XGrammarBackend(tokenizer, vocab_size, stop_token_ids,
                           options if isinstance(options, XGrammarOptions) else None)
