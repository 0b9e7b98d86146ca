"""frame's xgrammar grammar backend (``--grammar-backend xgrammar``, the default)."""

from frame_grammar_xgrammar.backend import XGrammarBackend, XGrammarOptions

__all__ = ["XGrammarBackend", "XGrammarOptions"]
