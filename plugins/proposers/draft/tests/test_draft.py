"""The draft proposer: the proposer conformance suite with the bundled model as its own draft, and its rules."""

from __future__ import annotations

import numpy as np
import pytest
from frame.errors import ConfigError
from frame.interfaces.proposer import ProposalRequest, ProposerContext
from frame.testing.proposer import ProposerConformance, draft_model_context
from frame_proposer_draft import DraftProposer, plugin
from frame_proposer_draft.plugin import frame_proposer_create
from frame_proposer_draft.proposer import DraftOptions, common_prefix


@pytest.fixture(scope="module")
def draft_context() -> ProposerContext:
    return draft_model_context()


class TestDraftConformance(ProposerConformance):
    vocab_size = 49152
    plugin_module = plugin
    plugin_name = "draft"

    @pytest.fixture
    def context(self, draft_context):
        return draft_context

    @pytest.fixture
    def make_proposer(self, context):
        return lambda k: DraftProposer(k, context.load_draft_model(None, 64))


def test_a_model_drafting_for_itself_proposes_its_own_greedy_continuation(draft_context) -> None:
    proposer = DraftProposer(4, draft_context.load_draft_model(None, 32))
    prompt = np.asarray([1, 504, 3458, 282, 4193, 314], dtype=np.int32)  # "<|im_start|>The capital of France is"
    [first] = proposer.propose([ProposalRequest("a", prompt, 4)])
    assert len(first.token_ids) == 4
    # One drafted token kept plus one new: the draft rewinds the other three and continues from there.
    grown = np.concatenate([prompt, np.asarray([first.token_ids[0], 11], dtype=np.int32)])
    [second] = proposer.propose([ProposalRequest("a", grown, 2)])
    assert len(second.token_ids) == 2 and proposer.inputs["a"][: len(grown)].tolist() == grown.tolist()


def test_a_full_draft_pool_leaves_requests_undrafted(draft_context) -> None:
    proposer = DraftProposer(3, draft_context.load_draft_model(None, 2))  # 32 token slots in all
    long = ProposalRequest("long", np.arange(1, 40, dtype=np.int32), 3)
    short = ProposalRequest("short", np.arange(1, 8, dtype=np.int32), 3)
    proposals = proposer.propose([long, short])
    assert proposals[0].token_ids == [] and len(proposals[1].token_ids) == 3


def test_refuses_tensor_parallelism_and_another_vocabulary(draft_context) -> None:
    from dataclasses import replace

    with pytest.raises(ConfigError, match="tensor_parallel_size 1 only"):
        frame_proposer_create(2, replace(draft_context, world_size=2), DraftOptions())
    with pytest.raises(ConfigError, match="vocabulary"):
        frame_proposer_create(2, replace(draft_context, vocab_size=7), DraftOptions(num_blocks=4))


def test_common_prefix() -> None:
    a = np.asarray([1, 2, 3, 4], dtype=np.int32)
    assert common_prefix(a, a) == 4 and common_prefix(a, a[:2]) == 2
    assert common_prefix(a, np.asarray([1, 9, 3], dtype=np.int32)) == 1
