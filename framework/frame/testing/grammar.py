"""Conformance suite for grammar-backend plugins: subclass :class:`GrammarConformance`.

A backend declares the constraint kinds it compiles (``supported``); the suite then checks, on the bundled
model's tokenizer, that each kind's masks allow exactly what the constraint allows (a walk along allowed tokens
ends in text that satisfies it), that accepting, rolling back and termination behave, and that a constraint that
cannot compile is a usage error naming the field. A subclass provides ``make_backend``
(``(tokenizer, vocab_size, stop_token_ids) -> GrammarBackend``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest

from frame.errors import InvalidSamplingError
from frame.interfaces.grammar import GrammarBackend, GrammarMatcher, unpack, words_for
from frame.sampling_params import StructuredOutputs

BackendFactory = Callable[[Any, int, list[int]], GrammarBackend]
#: A constraint of each kind, what the backend is walked into producing, and what must hold of the text.
CASES: dict[str, tuple[StructuredOutputs, Callable[[str], bool]]] = {
    "choice": (StructuredOutputs(choice=["apple", "banana split"]), lambda t: t in ("apple", "banana split")),
    "regex": (StructuredOutputs(regex="[0-9]{2}-[a-c]{2}"), lambda t: re.fullmatch("[0-9]{2}-[a-c]{2}", t) is not None),
    "json": (StructuredOutputs(json=json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                               "required": ["n"], "additionalProperties": False})),
             lambda t: isinstance(json.loads(t).get("n"), int)),
    "json_object": (StructuredOutputs(json_object=True), lambda t: isinstance(json.loads(t), dict)),
    "grammar": (StructuredOutputs(grammar='root ::= "x" ("y" | "z")'), lambda t: t in ("xy", "xz")),
}
BAD = {"json": StructuredOutputs(json='{"type": 3}'), "regex": StructuredOutputs(regex="(("),
       "grammar": StructuredOutputs(grammar="root ::= ")}


def allowed(matcher: GrammarMatcher, vocab: int) -> np.ndarray:
    """The tokens ``matcher`` allows next, as a bool array."""
    row = np.zeros(words_for(vocab), dtype=np.int32)
    matcher.fill_bitmask(row)
    return unpack(row[None], vocab)[0]


class GrammarConformance:
    """The contract of :class:`~frame.interfaces.grammar.GrammarBackend`, on the bundled model's tokenizer."""

    supported: ClassVar[tuple[str, ...]] = ("choice", "regex", "json", "json_object", "grammar")
    vocab_size = 49152
    stop_token = 2

    @pytest.fixture(scope="class")
    def tokenizer(self) -> Any:
        from frame.model_source import ModelSource

        return ModelSource.open(None).tokenizer

    @pytest.fixture
    def make_backend(self) -> BackendFactory:
        pytest.fail(f"{type(self).__name__} must define make_backend: (tokenizer, vocab, stop ids) -> backend")

    def walk(self, backend: GrammarBackend, spec: StructuredOutputs, tokenizer: Any, choose: int) -> str:
        """Generate along the masks (the ``choose``-th allowed token each time; after 8 tokens, one that closes a
        string, array or object if any is allowed, so open-ended constraints end) until the stop token is the only
        way on, or allowed after 12 tokens; returns the text."""
        matcher = backend.matcher(backend.compile(spec))
        tokens: list[int] = []
        for _ in range(40):
            options = np.flatnonzero(allowed(matcher, self.vocab_size))
            assert len(options), f"{spec.kind}: the mask allows nothing after {tokens}"
            words = [t for t in options if t != self.stop_token]
            if not words or (self.stop_token in options and len(tokens) > 12):
                assert matcher.accept(self.stop_token) and matcher.is_terminated()
                return tokenizer.decode(tokens)
            if len(tokens) >= 8:
                closing = [t for t in words[:2000] if tokenizer.decode([int(t)]).strip()[-1:] in ('}', '"', "]")]
                words = closing or words
            token = int(words[choose % len(words)])
            assert matcher.accept(token), f"{spec.kind}: an allowed token {token} was refused"
            tokens.append(token)
        pytest.fail(f"{spec.kind}: no end after 40 tokens: {tokenizer.decode(tokens)!r}")

    @pytest.mark.parametrize("kind", list(CASES))
    def test_walks_along_the_masks_satisfy_the_constraint(self, make_backend, tokenizer, kind: str) -> None:
        spec, holds = CASES[kind]
        backend = make_backend(tokenizer, self.vocab_size, [self.stop_token])
        if kind not in self.supported:  # refused in one sentence naming the field, never compiled wrongly
            self.assert_refused(backend, spec, kind)
            return
        for choose in (0, 1, 7):
            text = self.walk(backend, spec, tokenizer, choose)
            assert holds(text), f"{kind}: {text!r} breaks the constraint"

    def test_refusal_rollback_and_termination(self, make_backend, tokenizer) -> None:
        backend = make_backend(tokenizer, self.vocab_size, [self.stop_token])
        spec = CASES[self.supported[0]][0]
        matcher = backend.matcher(backend.compile(spec))
        start = allowed(matcher, self.vocab_size)
        refused = int(np.flatnonzero(~start)[0])
        assert not matcher.accept(refused) and (allowed(matcher, self.vocab_size) == start).all()
        first = int(np.flatnonzero(start)[0])
        assert matcher.accept(first)
        matcher.rollback(1)
        assert (allowed(matcher, self.vocab_size) == start).all() and not matcher.is_terminated()

    @pytest.mark.parametrize("kind", list(BAD))
    def test_a_constraint_that_cannot_compile_names_its_field(self, make_backend, tokenizer, kind: str) -> None:
        backend = make_backend(tokenizer, self.vocab_size, [self.stop_token])
        self.assert_refused(backend, BAD[kind], kind, starts_with_field=kind in self.supported)

    @staticmethod
    def assert_refused(backend: GrammarBackend, spec: StructuredOutputs, kind: str,
                       starts_with_field: bool = False) -> None:
        """``compile(spec)`` is an InvalidSamplingError whose param is the constraint's field."""
        with pytest.raises(InvalidSamplingError) as err:
            backend.compile(spec)
        assert err.value.param == f"structured_outputs.{kind}"
        assert not starts_with_field or str(err.value).startswith(err.value.param)

    def test_unsupported_kinds_are_usage_errors(self, make_backend, tokenizer) -> None:
        backend = make_backend(tokenizer, self.vocab_size, [self.stop_token])
        for kind in set(CASES) - set(self.supported):
            with pytest.raises(InvalidSamplingError):
                backend.compile(CASES[kind][0])
