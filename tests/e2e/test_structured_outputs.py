"""Structured outputs through the engine (offline API): every output obeys its constraint, with and without
speculative decoding, and a constraint that cannot compile is one sentence naming the field."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from frame import LLM, SamplingParams
from frame.errors import InvalidSamplingError
from frame.sampling_params import StructuredOutputs

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 10}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "scores", "address"],
    "additionalProperties": False,
}
PEOPLE = ["a chef from Lyon", "a retired pilot", "a student who plays chess", "a nurse", "a farmer in Kenya",
          "a software engineer", "a painter", "a marathon runner"]


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(dtype="float32", max_model_len=768, speculative_proposer="ngram", num_speculative_tokens=3)


def chat(llm: LLM, text: str) -> str:
    return llm.get_tokenizer().apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                   tokenize=False)


def test_json_schema_outputs_parse_and_validate(llm: LLM) -> None:
    prompts = [chat(llm, f"Describe {who} as a JSON user record.") for who in PEOPLE]
    spec = StructuredOutputs(json=json.dumps(SCHEMA))
    for temperature, chosen in ((0.0, prompts[:2]), (0.9, prompts[2:])):
        params = SamplingParams(temperature=temperature, seed=1, max_tokens=140, structured_outputs=spec)
        for result in llm.generate(chosen, params):
            text = result.outputs[0].text
            assert result.outputs[0].finish_reason == "stop", text
            jsonschema.validate(json.loads(text), SCHEMA)


def test_speculation_changes_nothing_under_a_grammar(llm: LLM) -> None:
    plain = LLM(dtype="float32", max_model_len=768)
    prompts = [chat(llm, f"Describe {who} as a JSON user record.") for who in PEOPLE[:2]]
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputs(json=json.dumps(SCHEMA)))
    assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == [
        r.outputs[0].token_ids for r in plain.generate(prompts, params)]


def test_regex_choice_json_object_and_grammar(llm: LLM) -> None:
    cases = [
        (StructuredOutputs(regex=r"[0-9]{3}-[0-9]{4}"), lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{4}", t)),
        (StructuredOutputs(choice=["positive", "negative", "neutral"]),
         lambda t: t in ("positive", "negative", "neutral")),
        (StructuredOutputs(json_object=True), lambda t: isinstance(json.loads(t), dict)),
        (StructuredOutputs(grammar='root ::= ("yes" | "no") ", because " [a-z ]{1,20} "."'),
         lambda t: re.fullmatch(r"(yes|no), because [a-z ]{1,20}\.", t)),
    ]
    prompt = chat(llm, "Is the weather nice today? Answer briefly.")
    for spec, check in cases:
        for seed in (0, 1):
            out = llm.generate(prompt, SamplingParams(temperature=0.8, seed=seed, max_tokens=60,
                                                       structured_outputs=spec))[0].outputs[0]
            assert check(out.text), (spec.kind, out.text)


@pytest.mark.parametrize(("spec", "field", "reason"), [
    (StructuredOutputs(json='{"type": "objectx"}'), "structured_outputs.json", 'Unsupported type "objectx"'),
    (StructuredOutputs(json="{not json"), "structured_outputs.json", "is not valid JSON"),
    (StructuredOutputs(regex="a(b"), "structured_outputs.regex", "The parenthesis is not closed"),
    (StructuredOutputs(grammar='root ::= "a" |'), "structured_outputs.grammar", "EBNF parser error"),
])
def test_a_constraint_that_cannot_compile_is_one_sentence(llm: LLM, spec, field: str, reason: str) -> None:
    with pytest.raises(InvalidSamplingError) as err:
        llm.generate("Hi", SamplingParams(max_tokens=4, structured_outputs=spec))
    assert err.value.param == field and reason in str(err.value) and "/project/" not in str(err.value)
    assert str(err.value).startswith(f"{field} ")


def test_exactly_one_constraint() -> None:
    with pytest.raises(InvalidSamplingError,
                       match="exactly one of json, json_object, regex, choice, grammar and structural_tag"):
        StructuredOutputs(regex="a", choice=["a"])
