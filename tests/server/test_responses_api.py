"""``POST /v1/responses`` through the real server and the openai SDK's ``client.responses``.

Plain text and message-list input with ``instructions`` answer what chat completions answers for the same
conversation; a stream sends OpenAI's event sequence and the same text; function tools come back as
``function_call`` items and their outputs go back in (inline or through ``previous_response_id``); ``text.format``
json_schema output validates; ``max_output_tokens`` makes an ``incomplete`` response.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(mp_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{mp_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_plain_text_input_answers_as_chat_does(client, chat_text) -> None:
    reply = client.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=12, temperature=0)
    assert reply.object == "response" and reply.id.startswith("resp_") and reply.model == MODEL
    assert reply.output_text == chat_text([{"role": "user", "content": "Name a colour."}], 12)
    assert reply.output[0].type == "message" and reply.output[0].role == "assistant"
    assert reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens


def test_message_list_with_instructions_and_an_incomplete_answer(client, chat_text) -> None:
    reply = client.responses.create(model=MODEL, instructions="Answer in French.", max_output_tokens=5,
                                    temperature=0, input=[{"role": "user", "content": "Say hello at length."},
                                                          {"role": "assistant", "content": "Hello!"},
                                                          {"type": "message", "role": "user", "content": [
                                                              {"type": "input_text", "text": "Again, longer."}]}])
    expected = chat_text([{"role": "system", "content": "Answer in French."},
                                  {"role": "user", "content": "Say hello at length."},
                                  {"role": "assistant", "content": "Hello!"},
                                  {"role": "user", "content": "Again, longer."}], 5)
    assert reply.output_text == expected
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 5


def test_a_stream_sends_the_documented_events_and_the_same_text(client) -> None:
    kwargs = dict(model=MODEL, input="Name three fruits.", max_output_tokens=64, temperature=0)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas and kinds == ["response.created", "response.in_progress", "response.output_item.added",
                                "response.content_part.added", *["response.output_text.delta"] * len(deltas),
                                "response.output_text.done", "response.content_part.done",
                                "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert "".join(deltas) == final.output_text == client.responses.create(**kwargs).output_text
    assert 0 < final.usage.output_tokens < 64 and events[0].response.status == "in_progress"


def test_a_function_tool_call_and_its_output_back(client) -> None:
    reply = client.responses.create(model=MODEL, input="What is the weather in Oslo?", tools=[WEATHER],
                                    tool_choice="required", max_output_tokens=100, temperature=0)
    calls = [item for item in reply.output if item.type == "function_call"]
    assert reply.status == "completed" and calls
    for call in calls:
        assert call.name == "get_weather" and call.call_id.startswith("call_")
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    answer = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}
    inline = client.responses.create(model=MODEL, tools=[WEATHER], max_output_tokens=8, temperature=0,
                                     input=[{"role": "user", "content": "What is the weather in Oslo?"},
                                            *[c.model_dump(exclude_none=True) for c in calls], answer])
    chained = client.responses.create(model=MODEL, tools=[WEATHER], max_output_tokens=8, temperature=0,
                                      previous_response_id=reply.id, input=[answer])
    assert inline.output_text and chained.output_text == inline.output_text
    assert chained.previous_response_id == reply.id


def test_a_streamed_function_call(client) -> None:
    events = list(client.responses.create(model=MODEL, input="Weather in Rome?", tools=[WEATHER], stream=True,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=60, temperature=0))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    done = events[4]
    assert done.name == "get_weather" and json.loads(done.arguments)["city"]
    assert events[-1].response.output[0].call_id == events[5].item.call_id


def test_json_schema_text_format(client) -> None:
    reply = client.responses.create(model=MODEL, input="Invent a person, as JSON.", max_output_tokens=80,
                                    temperature=0, text={"format": {"type": "json_schema", "name": "person",
                                                                    "schema": PERSON, "strict": True}})
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), PERSON)
    assert reply.text.format.type == "json_schema"


def test_previous_response_id_needs_a_stored_response(client) -> None:
    first = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False)
    for missing in (first.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model=MODEL, input="And?", max_output_tokens=2, previous_response_id=missing)
        assert err.value.body["param"] == "previous_response_id" and "store false" in err.value.body["message"]


def test_unknown_fields_and_bad_tools_are_400s_naming_them(client) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="Hi", extra_body={"max_tokens": 5})
    assert err.value.body["message"] == "Unknown parameter 'max_tokens'; remove it."
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="Hi", tools=[WEATHER],
                                tool_choice={"type": "function", "name": "nope"})
    assert err.value.body["param"] == "tool_choice" and "not in tools" in err.value.body["message"]
    reply = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, reasoning={"effort": "low"},
                                    metadata={"a": "b"}, include=[], truncation="disabled")
    assert reply.metadata == {"a": "b"}
