"""Conformance suite for speculative-decoding proposer plugins: subclass :class:`ProposerConformance`.

A proposer may propose anything (rejection sampling keeps the output exact), so the suite checks the contract
rather than quality: one proposal per request, in order; never more drafts than a request may take; token ids
inside the vocabulary; draft probabilities, when given, shaped and normalised; requests that grow between calls
(as verification keeps some drafts and adds a token) and requests forgotten in between. A subclass provides the
``make_proposer`` fixture (``num_speculative_tokens -> Proposer``) and may override ``context``::

    class TestMyProposer(ProposerConformance):
        @pytest.fixture
        def make_proposer(self, context):
            return lambda k: MyProposer(k)
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import numpy as np
import pytest

from frame.interfaces.proposer import Proposal, ProposalRequest, Proposer, ProposerContext

ProposerFactory = Callable[[int], Proposer]


def _no_draft_model(model: str, num_blocks: int) -> None:
    raise RuntimeError("this suite's context loads no draft model; override the context fixture")


def random_tokens(seed: int, length: int, vocab: int, repeats: bool = True) -> np.ndarray:
    """Token ids with repeated runs (so look-up proposers find something), int32 like the runner's."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab, size=length, dtype=np.int32)
    if repeats and length >= 12:
        tokens[length // 2 : length // 2 + 6] = tokens[2:8]
        tokens[-3:] = tokens[2:5]
    return tokens


class ProposerConformance:
    """The contract of :class:`~frame.interfaces.proposer.Proposer`, run against ``make_proposer``."""

    vocab_size = 1000
    #: The plugin's module and name; when set, the suite also creates the proposer through its hooks.
    plugin_module: ModuleType | None = None
    plugin_name: str = ""

    @pytest.fixture
    def context(self) -> ProposerContext:
        return ProposerContext(vocab_size=self.vocab_size, max_model_len=512, max_num_seqs=8, world_size=1,
                               load_draft_model=_no_draft_model)

    @pytest.fixture
    def make_proposer(self, context: ProposerContext) -> ProposerFactory:
        pytest.fail(f"{type(self).__name__} must define a make_proposer fixture: k -> Proposer")

    def check(self, requests: list[ProposalRequest], proposals: list[Proposal]) -> None:
        assert len(proposals) == len(requests), "one proposal per request"
        for request, proposal in zip(requests, proposals, strict=True):
            assert isinstance(proposal, Proposal)
            assert len(proposal.token_ids) <= request.max_tokens, f"{request.req_id}: too many drafts"
            assert all(isinstance(t, int) and 0 <= t < self.vocab_size for t in proposal.token_ids)
            if proposal.probs is not None and proposal.token_ids:
                probs = proposal.probs
                assert probs.shape[0] >= len(proposal.token_ids) and probs.shape[-1] >= self.vocab_size
                assert float(probs.min()) >= 0 and abs(float(probs[0].sum()) - 1) < 1e-3

    def test_proposals_respect_every_limit(self, make_proposer: ProposerFactory) -> None:
        proposer = make_proposer(4)
        assert proposer.num_speculative_tokens == 4
        requests = [ProposalRequest(f"r{i}", random_tokens(i, 8 + 9 * i, self.vocab_size), i % 5) for i in range(6)]
        self.check(requests, proposer.propose(requests))
        assert proposer.propose([]) == []

    def test_requests_grow_and_are_forgotten_between_calls(self, make_proposer: ProposerFactory) -> None:
        proposer = make_proposer(3)
        tokens = {f"r{i}": random_tokens(10 + i, 20 + i, self.vocab_size) for i in range(3)}
        for step in range(4):
            requests = [ProposalRequest(rid, t, 3) for rid, t in tokens.items()]
            proposals = proposer.propose(requests)
            self.check(requests, proposals)
            for (rid, t), proposal in zip(list(tokens.items()), proposals, strict=True):
                kept = proposal.token_ids[: step % 3]  # as if verification kept some drafts, then added a token
                tokens[rid] = np.concatenate([t, np.asarray([*kept, 7 + step], dtype=np.int32)])
            if step == 1:
                proposer.forget("r1")
                del tokens["r1"]
        proposer.forget("never-seen")

    def test_zero_lookahead_is_refused(self, make_proposer: ProposerFactory) -> None:
        with pytest.raises(ValueError, match="num_speculative_tokens"):
            make_proposer(0)

    def test_created_through_the_plugin_hooks(self, context: ProposerContext) -> None:
        if self.plugin_module is None:
            pytest.skip("set plugin_module and plugin_name to check registration and the create hook")
        from frame.testing.registration import plugin_hooks

        with plugin_hooks("proposer", self.plugin_name, self.plugin_module) as (hooks, options):
            proposer = hooks.create_proposer(self.plugin_name, 2, context, options)
            assert isinstance(proposer, Proposer) and proposer.num_speculative_tokens == 2


def draft_model_context(max_model_len: int = 512, **engine: object) -> ProposerContext:
    """A context whose ``load_draft_model`` builds real :class:`~frame.engine.worker.drafting.DraftModel` objects on
    this machine's platform (float32 and the default attention backend unless ``engine`` says otherwise). A checkpoint
    is loaded once; every later call returns the same model, reset to the pool size asked for."""
    from frame.config import build_config
    from frame.engine.selection import select
    from frame.engine.worker.drafting import DraftModel
    from frame.model_source import ModelSource
    from frame.plugins.hooks import PluginHooks
    from frame.plugins.registry import PluginRegistry

    config = build_config(**{"dtype": "float32", **engine})
    hooks = PluginHooks(PluginRegistry())
    selection = select(config, hooks)
    vocab = int(ModelSource.open(config.model).hf_config.vocab_size)

    loaded: dict[str | None, DraftModel] = {}

    def load(model: str | None, num_blocks: int) -> DraftModel:
        # One load per checkpoint (weights take seconds to read); each caller gets it reset to its pool size.
        if model not in loaded:
            loaded[model] = DraftModel(model, hooks, selection, max_model_len, config.block_size, 2048, 8)
        loaded[model].reset(num_blocks)
        return loaded[model]

    return ProposerContext(vocab_size=vocab, max_model_len=max_model_len, max_num_seqs=8, world_size=1,
                           load_draft_model=load)
