"""Hook implementations of the ngram proposer plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.proposer import Proposer, ProposerContext
from pydantic import BaseModel

from frame_proposer_ngram.proposer import NgramOptions, NgramProposer

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    return NgramOptions


@hookimpl
def frame_proposer_create(num_speculative_tokens: int, context: ProposerContext,
                          options: BaseModel | None) -> Proposer:
    """Prompt lookup; it needs nothing of the target model, so it serves any number of ranks."""
    return NgramProposer(num_speculative_tokens, options if isinstance(options, NgramOptions) else None)
