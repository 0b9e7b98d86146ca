"""frame's draft-model proposer (``--speculative-proposer draft --speculative-opt model=PATH``)."""

from frame_proposer_draft.proposer import DraftOptions, DraftProposer

__all__ = ["DraftOptions", "DraftProposer"]
