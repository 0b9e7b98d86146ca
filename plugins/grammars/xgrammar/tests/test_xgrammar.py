"""The xgrammar backend on its own: compiled constraints, masks, rollback, and errors naming the field."""

from __future__ import annotations

import json

import numpy as np
import pytest
from frame.errors import InvalidSamplingError
from frame.interfaces.grammar import unpack, words_for
from frame.model_source import ModelSource
from frame.sampling_params import StructuredOutputs
from frame_grammar_xgrammar import XGrammarBackend

VOCAB = 49152


@pytest.fixture(scope="module")
def tokenizer():
    return ModelSource.open(None).tokenizer


@pytest.fixture(scope="module")
def backend(tokenizer) -> XGrammarBackend:
    return XGrammarBackend(tokenizer, VOCAB, [2])


def allowed(matcher) -> np.ndarray:
    row = np.zeros(words_for(VOCAB), dtype=np.int32)
    matcher.fill_bitmask(row)
    return unpack(row[None], VOCAB)[0]


def test_a_choice_allows_exactly_its_strings(backend, tokenizer) -> None:
    matcher = backend.matcher(backend.compile(StructuredOutputs(choice=["yes", "no"])))
    first = allowed(matcher)
    yes, no = tokenizer("yes")["input_ids"][0], tokenizer("no")["input_ids"][0]
    assert first[yes] and first[no] and first.sum() < 50
    assert matcher.accept(yes) and not matcher.accept(no)
    assert allowed(matcher)[2]  # then only the stop token ...
    assert matcher.accept(2) and matcher.is_terminated()


def test_rollback_returns_to_an_earlier_state(backend, tokenizer) -> None:
    matcher = backend.matcher(backend.compile(StructuredOutputs(json=json.dumps({"type": "object"}))))
    start = allowed(matcher)
    for token in tokenizer('{"a":')["input_ids"]:
        assert matcher.accept(token)
    matcher.rollback(len(tokenizer('{"a":')["input_ids"]))
    assert (allowed(matcher) == start).all()


def test_json_object_means_an_object(backend, tokenizer) -> None:
    matcher = backend.matcher(backend.compile(StructuredOutputs(json_object=True)))
    assert not matcher.accept(tokenizer("[")["input_ids"][0])
    assert matcher.accept(tokenizer("{")["input_ids"][0])


@pytest.mark.parametrize(("spec", "message"), [
    (StructuredOutputs(json='{"type": 3}'), "structured_outputs.json cannot be compiled: "),
    (StructuredOutputs(regex="(("), "structured_outputs.regex cannot be compiled: "),
    (StructuredOutputs(grammar="root ::= "), "structured_outputs.grammar cannot be compiled: "),
])
def test_errors_name_the_field_without_source_paths(backend, spec, message: str) -> None:
    with pytest.raises(InvalidSamplingError) as err:
        backend.compile(spec)
    assert str(err.value).startswith(message) and ".cc:" not in str(err.value) and str(err.value).endswith(".")


def test_a_structural_tag_of_calls_may_end_after_each_call(backend, tokenizer) -> None:
    # The shape the server builds for tool_choice "required": calls separated by ", ", ending after any of them.
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    tag = {"type": "tag", "begin": '{"name": "f", "parameters": ', "end": "}",
           "content": {"type": "json_schema", "json_schema": schema}}
    spec = StructuredOutputs(structural_tag=json.dumps({"type": "structural_tag", "format": {
        "type": "tags_with_separator", "tags": [tag], "separator": ", ", "at_least_one": True}}))
    matcher = backend.matcher(backend.compile(spec))
    assert not allowed(matcher)[2]  # at least one call
    for token in tokenizer('{"name": "f", "parameters": {"x": 1}}')["input_ids"]:
        assert matcher.accept(token)
    after_one = allowed(matcher)
    comma = tokenizer(", ")["input_ids"][0]
    assert after_one[2] and after_one[comma]  # the stop token, or a separator and another call
    assert matcher.accept(comma)
    assert not allowed(matcher)[2]  # after a separator, another call must follow
    with pytest.raises(InvalidSamplingError) as err:
        backend.compile(StructuredOutputs(structural_tag='{"type": "structural_tag", "format": {"type": "nope"}}'))
    assert err.value.param == "structured_outputs.structural_tag"


@pytest.mark.parametrize(("spec", "field"), [
    (StructuredOutputs(regex="a{4294967296}"), "structured_outputs.regex"),
    (StructuredOutputs(regex="(ab){1,2147483648}"), "structured_outputs.regex"),
    (StructuredOutputs(regex="x{99999999999999999999999}"), "structured_outputs.regex"),
    (StructuredOutputs(grammar='root ::= "a"{0,4294967296}'), "structured_outputs.grammar"),
    (StructuredOutputs(json=json.dumps({"type": "string", "pattern": "a{4294967296}"})),
     "structured_outputs.json"),
    (StructuredOutputs(json=json.dumps({"type": "object", "properties": {"s": {
        "type": "string", "maxLength": 4294967296}}})), "structured_outputs.json"),
])
def test_counts_past_32_bits_are_refused_not_wrapped(backend, spec, field: str) -> None:
    """xgrammar keeps repetition counts in 32 bits: a{4294967296} would become a{0} and accept the empty output."""
    with pytest.raises(InvalidSamplingError) as err:
        backend.compile(spec)
    # A schema pattern meets the lower max_pattern_repeat bound first; the others name xgrammar's 32-bit bound.
    assert err.value.param == field, str(err.value)
    assert "2147483647" in str(err.value) or "max_pattern_repeat=N" in str(err.value), str(err.value)


def test_counts_xgrammar_holds_and_literal_braces_still_compile(backend) -> None:
    for spec in (StructuredOutputs(regex="a{2147483647}"), StructuredOutputs(regex=r"\{4294967296\}"),
                 StructuredOutputs(regex="[{]4294967296[}]"), StructuredOutputs(grammar='root ::= "{4294967296}"'),
                 StructuredOutputs(json=json.dumps({"type": "string", "maxLength": 2147483647}))):
        backend.compile(spec)


def test_a_schema_nested_past_the_limit_is_refused_before_compiling(backend) -> None:
    """900 levels of ``items`` took xgrammar minutes; past MAX_SCHEMA_DEPTH the schema is a usage error at once."""
    from frame_grammar_xgrammar.bounds import MAX_SCHEMA_DEPTH

    for depth in (MAX_SCHEMA_DEPTH, 900, 5000):
        text = '{"type": "array", "items": ' * depth + '{"type": "integer"}' + "}" * depth
        with pytest.raises(InvalidSamplingError) as err:
            backend.compile(StructuredOutputs(json=text))
        assert err.value.param == "structured_outputs.json", str(err.value)
    shallow = '{"type": "array", "items": ' * 8 + '{"type": "integer"}' + "}" * 8
    backend.compile(StructuredOutputs(json=shallow))


def test_the_options_lower_the_bounds_and_the_message_names_the_option(tokenizer) -> None:
    """max_repeat, max_pattern_repeat and max_schema_depth refuse past their values, naming the option to raise."""
    from frame_grammar_xgrammar.backend import XGrammarOptions

    options = XGrammarOptions(max_repeat=50, max_pattern_repeat=20, max_schema_depth=4)
    small = XGrammarBackend(tokenizer, VOCAB, [2], options)
    pattern = json.dumps({"type": "string", "pattern": "a{21}"})
    nested = '{"type": "array", "items": ' * 4 + '{"type": "integer"}' + "}" * 4
    for spec, option in ((StructuredOutputs(regex="a{51}"), "max_repeat=N"),
                         (StructuredOutputs(grammar='root ::= "a"{0,51}'), "max_repeat=N"),
                         (StructuredOutputs(json=pattern), "max_pattern_repeat=N"),
                         (StructuredOutputs(json=nested), "max_schema_depth=N")):
        with pytest.raises(InvalidSamplingError) as err:
            small.compile(spec)
        assert option in str(err.value), str(err.value)
    small.compile(StructuredOutputs(regex="a{50}"))
    small.compile(StructuredOutputs(json=json.dumps({"type": "string", "pattern": "a{20}"})))


def test_memory_bytes_reports_the_compiled_size(backend) -> None:
    """The engine's grammar cache bound counts these bytes: a bigger alternation reports more."""
    small = backend.memory_bytes(backend.compile(StructuredOutputs(regex="a|b")))
    large = backend.memory_bytes(backend.compile(StructuredOutputs(regex="|".join(f"w{i}x" for i in range(3000)))))
    assert 0 < small < large, (small, large)
