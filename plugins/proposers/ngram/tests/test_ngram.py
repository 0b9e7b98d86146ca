"""The ngram proposer: the proposer conformance suite, and prompt lookup's own rules."""

from __future__ import annotations

import numpy as np
import pytest
from frame.interfaces.proposer import ProposalRequest
from frame.testing.proposer import ProposerConformance
from frame_proposer_ngram import NgramOptions, NgramProposer, find_continuation, plugin
from pydantic import ValidationError


class TestNgramConformance(ProposerConformance):
    plugin_module = plugin
    plugin_name = "ngram"

    @pytest.fixture
    def make_proposer(self, context):
        return NgramProposer


def tokens(*ids: int) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)


def test_the_most_recent_earlier_occurrence_proposes_what_followed_it() -> None:
    text = tokens(5, 6, 7, 1, 2, 5, 6, 8, 9, 3, 5, 6)
    assert find_continuation(text, 2, 3) == [8, 9, 3]  # "5 6" last occurred before "8 9 3", not "7 1 2"
    assert find_continuation(text, 3, 3) == []  # "3 5 6" never occurred before
    assert find_continuation(tokens(4, 4, 4), 1, 5) == [4]  # the suffix itself is not a match


def test_matches_must_start_on_a_token_boundary() -> None:
    # 256 = 00 01 00 00 and 1 = 01 00 00 00 in little-endian bytes: their concatenation contains the bytes of 1
    # starting one byte in, which must not count as a match.
    assert find_continuation(tokens(256, 0, 9, 1), 1, 2) == []
    assert find_continuation(tokens(1, 42, 256, 0, 1), 1, 2) == [42, 256]


def test_longer_ngrams_win_and_limits_hold() -> None:
    proposer = NgramProposer(4, NgramOptions(min_n=1, max_n=3))
    text = tokens(1, 2, 3, 10, 11, 2, 3, 20, 21, 22, 23, 1, 2, 3)
    [proposal] = proposer.propose([ProposalRequest("a", text, 4)])
    assert proposal.token_ids == [10, 11, 2, 3] and proposal.probs is None
    [short] = proposer.propose([ProposalRequest("a", text, 1)])
    assert short.token_ids == [10]


def test_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="min_n"):
        NgramOptions(min_n=5, max_n=3)
