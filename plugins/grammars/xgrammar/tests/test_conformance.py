"""frame's grammar-backend conformance suite, run on xgrammar."""

from __future__ import annotations

import pytest
from frame.testing.grammar import GrammarConformance
from frame_grammar_xgrammar import XGrammarBackend


class TestXGrammarConformance(GrammarConformance):
    @pytest.fixture
    def make_backend(self):
        return XGrammarBackend
