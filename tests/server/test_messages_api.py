"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` through the real server and the anthropic SDK.

A plain message answers what chat completions answers for the same conversation; a stream sends Anthropic's event
sequence and the same text; a tool comes back as a ``tool_use`` block (streamed too) and its ``tool_result`` goes
back in; ``stop_sequences`` stop with ``stop_reason: stop_sequence``; usage adds up to count_tokens; and errors
on these routes are in Anthropic's shape.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"], "additionalProperties": False}}
#: Today's anthropic SDK has no temperature argument; the server still takes it (older clients and vLLM send it).
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "Name three fruits."}]


@pytest.fixture(scope="module")
def client(mp_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=mp_server.base_url, api_key="unused", max_retries=0, timeout=300)


def test_a_plain_message_answers_as_chat_does_and_counts_its_tokens(client, chat_text) -> None:
    reply = client.messages.create(model=MODEL, max_tokens=64, messages=ASK, extra_body=GREEDY,
                                   system=[{"type": "text", "text": "Be brief."}])
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    [block] = reply.content
    expected = chat_text([{"role": "system", "content": "Be brief."}, *ASK], 64)
    assert block.type == "text" and block.text == expected
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    counted = client.messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.")
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted.input_tokens > 0
    assert 0 < reply.usage.output_tokens < 64


def test_content_blocks_and_max_tokens(client, chat_text) -> None:
    reply = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Say hello "}, {"type": "text", "text": "at length."}]},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Now tell me a long story."}])
    expected = chat_text([{"role": "user", "content": "Say hello at length."},
                                {"role": "assistant", "content": "Hello!"},
                                {"role": "user", "content": "Now tell me a long story."}], 4)
    assert reply.content[0].text == expected and reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == 4


def test_a_stream_sends_anthropics_events_and_the_same_text(client) -> None:
    kwargs = dict(model=MODEL, max_tokens=64, messages=ASK, extra_body=GREEDY)
    events = list(client.messages.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert deltas and kinds == ["message_start", "content_block_start", *["content_block_delta"] * len(deltas),
                                "content_block_stop", "message_delta", "message_stop"]
    assert "".join(deltas) == client.messages.create(**kwargs).content[0].text
    assert events[-2].delta.stop_reason == "end_turn" and events[-2].usage.output_tokens > 0
    with client.messages.stream(**kwargs) as stream:
        assert stream.get_final_text() == "".join(deltas)


def test_stop_sequences(client) -> None:
    kwargs = dict(model=MODEL, max_tokens=64, messages=ASK, extra_body=GREEDY)
    full = client.messages.create(**kwargs).content[0].text
    word = full.split()[2]
    reply = client.messages.create(stop_sequences=["zzz-never", word], **kwargs)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == word
    assert reply.content[0].text == full[:full.index(word)]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_and_its_result_back(client, stream: bool) -> None:
    kwargs = dict(model=MODEL, max_tokens=100, extra_body=GREEDY, tools=[WEATHER], tool_choice={"type": "any"},
                  messages=[{"role": "user", "content": "What is the weather in Oslo?"}])
    if stream:
        with client.messages.stream(**kwargs) as events:
            reply = events.get_final_message()
    else:
        reply = client.messages.create(**kwargs)
    assert reply.stop_reason == "tool_use"
    uses = [block for block in reply.content if block.type == "tool_use"]
    assert uses and all(use.name == "get_weather" and use.id.startswith("toolu_") for use in uses)
    for use in uses:
        jsonschema.validate(use.input, WEATHER["input_schema"])
    answer = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, tools=[WEATHER], messages=[
        *kwargs["messages"], {"role": "assistant", "content": [u.model_dump() for u in uses]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny"}]}])
    assert answer.content[0].type == "text" and answer.content[0].text


def test_errors_are_in_anthropics_shape(client) -> None:
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=4, messages=ASK, extra_body={"stop": ["x"]})
    assert err.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                         "message": "Unknown parameter 'stop'; remove it."}}
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-nope", max_tokens=4, messages=ASK)
    assert err.value.body["error"]["type"] == "not_found_error" and MODEL in err.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=4, messages=ASK, tools=[WEATHER], tool_choice={"type": "tool"})
    assert err.value.body["error"]["message"] == "tool_choice of type tool needs the name of the tool to call."


def test_output_config_json_schema(client) -> None:
    # A bounded age: unbounded, greedy digits of the packed Q4_1 model ran past max_tokens ("age": 1000000...).
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = client.messages.create(model=MODEL, max_tokens=80, messages=[{"role": "user", "content": "A person?"}],
                                   output_config={"format": {"type": "json_schema", "schema": person},
                                                  "effort": "low"}, extra_body=GREEDY)
    jsonschema.validate(json.loads(reply.content[0].text), person)
