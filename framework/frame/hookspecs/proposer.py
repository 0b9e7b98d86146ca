"""Hooks of speculative-decoding proposer plugins (entry-point group ``frame.proposers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.proposer import Proposer, ProposerContext


@hookspec
def frame_proposer_create(num_speculative_tokens: int, context: ProposerContext, options: BaseModel | None) -> Proposer:
    """Create the proposer that drafts up to ``num_speculative_tokens`` tokens per request per step.

    Called once by every model worker (each tensor-parallel rank) on the selected plugin, after the target model
    is loaded, when the engine runs with ``speculative.proposer`` set. ``context`` describes the target (vocabulary
    size, context length, running limit, ranks) and can load a draft model; ``options`` is the plugin's options
    instance or None. Raise a ``frame.errors.ConfigError`` naming the fix when the proposer cannot serve this engine.
    Since API 2.
    """
