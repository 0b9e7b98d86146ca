"""Structured outputs and tool calling through the real server and the openai client.

Every constrained output parses and satisfies its constraint (50 JSON-schema prompts, regexes, choices); tool calls
come back parsed, valid for their tool's schema, streamed and not; ``auto`` finds Hermes calls in the model's text;
and a constraint or tool choice the server cannot honour is a 400 naming the field.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 30},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "rating": {"type": "number", "minimum": 0, "maximum": 5},
        "genre": {"enum": ["drama", "comedy", "horror", "documentary"]},
        "cast": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 2},
        "studio": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                    "country": {"enum": ["US", "FR", "JP", "IN"]}},
                   "required": ["name", "country"], "additionalProperties": False},
    },
    "required": ["title", "year", "rating", "genre", "cast", "studio"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40}},
                                     "required": ["query"], "additionalProperties": False}}}
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "search": SEARCH["function"]["parameters"]}


@pytest.fixture(scope="module")
def client(mp_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{mp_server.base_url}/v1", api_key="unused", max_retries=0, timeout=600)


def ask(client: openai.OpenAI, text: str, **kwargs):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **kwargs)


def test_fifty_json_schema_outputs_all_validate(client) -> None:
    topics = ["a film about " + t for t in ("space", "cooking", "a war", "a dog", "love", "robots", "the sea",
                                             "music", "a heist", "a school")]
    fmt = {"type": "json_schema", "json_schema": {"name": "film", "schema": SCHEMA, "strict": True}}

    def one(i: int) -> dict:
        reply = ask(client, f"Describe {topics[i % 10]} as JSON.", response_format=fmt, max_tokens=320,
                    temperature=0.7 if i % 2 else 0.0, seed=i)
        choice = reply.choices[0]
        # The schema bounds every string, so even odd sampled characters (a token each) end within max_tokens.
        assert choice.finish_reason == "stop", choice.message.content
        return json.loads(choice.message.content)

    with ThreadPoolExecutor(max_workers=25) as pool:
        films = list(pool.map(one, range(50)))
    for film in films:
        jsonschema.validate(film, SCHEMA)


def test_regex_choice_and_json_object_constraints(client) -> None:
    for seed in range(3):
        date = ask(client, "When is the next full moon?", max_tokens=20, temperature=1.0, seed=seed,
                   extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"}})
        assert re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]", date.choices[0].message.content)
        mood = ask(client, "How do you feel?", max_tokens=10, temperature=1.0, seed=seed,
                   extra_body={"structured_outputs": {"choice": ["happy", "sad", "curious"]}})
        assert mood.choices[0].message.content in ("happy", "sad", "curious")
    obj = client.completions.create(model=MODEL, prompt="A JSON object describing a cat:", max_tokens=200,
                                    extra_body={"response_format": {"type": "json_object"}}, temperature=0)
    assert isinstance(json.loads(obj.choices[0].text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_calls_are_parsed_and_valid(client, stream: bool) -> None:
    kwargs = dict(tools=[WEATHER, SEARCH], tool_choice="required", max_tokens=80, temperature=0)
    if not stream:
        reply = ask(client, "What's the weather like in Lyon?", **kwargs)
        choice = reply.choices[0]
        calls, reason = choice.message.tool_calls, choice.finish_reason
        assert choice.message.content is None
    else:
        calls, reason = [], None
        for chunk in ask(client, "What's the weather like in Lyon?", stream=True, **kwargs):
            if chunk.choices and chunk.choices[0].delta.tool_calls:
                calls += chunk.choices[0].delta.tool_calls
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
    assert reason == "tool_calls" and calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_named_function_and_the_answer_back_through_the_template(client) -> None:
    choice = ask(client, "Look up the tallest mountain.", tools=[WEATHER, SEARCH], max_tokens=60, temperature=0,
                 tool_choice={"type": "function", "function": {"name": "search"}}).choices[0]
    [call] = choice.message.tool_calls
    assert call.function.name == "search"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["search"])
    follow_up = client.chat.completions.create(model=MODEL, max_tokens=10, tools=[SEARCH], tool_choice="none",
                                               messages=[
                                                   {"role": "user", "content": "Look up the tallest mountain."},
                                                   {"role": "assistant", "content": None,
                                                    "tool_calls": [call.model_dump()]},
                                                   {"role": "tool", "tool_call_id": call.id,
                                                    "content": "Mount Everest, 8849 m"}])
    assert follow_up.choices[0].message.tool_calls is None and follow_up.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_auto_finds_hermes_calls_in_the_text(client, stream: bool) -> None:
    # The model's text is scripted with a regex constraint: "Sure." and one Hermes-style call block.
    script = (r'Sure\. <tool_call>\{"name": "get_weather", '
              r'"arguments": \{"city": "(Paris|Rome)", "unit": "celsius"\}\}</tool_call>')
    kwargs = dict(tools=[WEATHER], tool_choice="auto", max_tokens=80, temperature=0,
                  extra_body={"structured_outputs": {"regex": script}})
    if not stream:
        message = ask(client, "Weather in Paris?", **kwargs).choices[0].message
        content, calls = message.content, message.tool_calls
    else:
        content, calls = "", []
        for chunk in ask(client, "Weather in Paris?", stream=True, **kwargs):
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                calls += chunk.choices[0].delta.tool_calls or []
        assert "<tool" not in content  # the call's tag never streams as content
    assert content.strip() == "Sure." and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")


@pytest.mark.parametrize(("kwargs", "param", "fragment"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format.json_schema.schema", "cannot be compiled"),
    ({"extra_body": {"structured_outputs": {"regex": "(unclosed"}}}, "structured_outputs.regex", "parenthesis"),
    ({"extra_body": {"structured_outputs": {"grammar": 'root ::= "a" |'}}}, "structured_outputs.grammar", "EBNF"),
    ({"extra_body": {"structured_outputs": {"regex": "a{4294967296}"}}}, "structured_outputs.regex", "2147483647"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not in tools"),
    ({"extra_body": {"num_speculative_tokens": 99}}, "num_speculative_tokens", "16"),
    ({"extra_body": {"num_speculative_tokens": 3}}, "num_speculative_tokens", "--speculative-proposer"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_constraints_and_tool_choices_are_400s_naming_the_field(client, kwargs, param, fragment,
                                                                     stream: bool) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        reply = ask(client, "Hi", max_tokens=5, stream=stream, **kwargs)
        if stream:
            list(reply)
    body = err.value.body
    assert body["param"] == param and fragment in body["message"], body
