"""Hook implementations of the draft-model proposer plugin."""

from __future__ import annotations

from frame.errors import ConfigError
from frame.hookspecs import hookimpl
from frame.interfaces.proposer import Proposer, ProposerContext
from pydantic import BaseModel

from frame_proposer_draft.proposer import DraftOptions, DraftProposer

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    return DraftOptions


@hookimpl
def frame_proposer_create(num_speculative_tokens: int, context: ProposerContext,
                          options: BaseModel | None) -> Proposer:
    """Load the draft model on this worker; one rank only (the draft does not shard)."""
    opts = options if isinstance(options, DraftOptions) else DraftOptions()
    if context.world_size > 1:
        raise ConfigError("The draft proposer runs with tensor_parallel_size 1 only; use the ngram proposer or one "
                          "rank.", param="speculative_proposer")
    draft = context.load_draft_model(opts.model, opts.num_blocks)
    if draft.vocab_size != context.vocab_size:
        raise ConfigError(f"The draft model's vocabulary ({draft.vocab_size} tokens) differs from the target's "
                          f"({context.vocab_size}); pick a draft with the same tokenizer.",
                          param="speculative_options")
    return DraftProposer(num_speculative_tokens, draft)
