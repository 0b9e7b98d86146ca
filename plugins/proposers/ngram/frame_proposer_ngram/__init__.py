"""frame's prompt-lookup proposer (``--speculative-proposer ngram``)."""

from frame_proposer_ngram.proposer import NgramOptions, NgramProposer, find_continuation

__all__ = ["NgramOptions", "NgramProposer", "find_continuation"]
