"""Standard OpenAI fields frame does not act on are accepted; misspelled ones still get the 400 that names them;
``GET /v1/models/{id}``; and ``tool_choice: "required"`` ends after the calls the model needs.

Everything goes through the real server and the openai client.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
#: The fields issue 33 found refused, with values the openai SDK and other clients send.
IGNORED = {"store": True, "metadata": {"run": "a1"}, "service_tier": "auto", "reasoning_effort": "low",
           "prompt_cache_key": "k-1", "safety_identifier": "u-42", "verbosity": "low", "user": "someone",
           "prompt_cache_retention": "in_memory", "modalities": ["text"]}
#: An assistant message as OpenAI and vLLM return it, sent back as clients do.
ECHOED = {"role": "assistant", "content": "Hello!", "refusal": None, "annotations": [],
          "function_call": {"name": "noop", "arguments": "{}"}, "audio": None, "reasoning_content": None}
FINAL_RESULT = {"type": "function", "function": {
    "name": "final_result", "description": "The structured answer",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                   "required": ["name", "age"]}}}


@pytest.fixture(scope="module")
def client(mp_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{mp_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def hello(**kwargs) -> dict:
    return dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, **kwargs)


@pytest.mark.parametrize("field", sorted(IGNORED))
def test_each_standard_field_is_accepted_on_chat_and_completions(client, field: str) -> None:
    reply = client.chat.completions.create(**hello(extra_body={field: IGNORED[field]}))
    assert reply.choices[0].message.content is not None
    text = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body={field: IGNORED[field]})
    assert text.choices[0].text


@pytest.mark.parametrize("field", sorted(ECHOED.keys() - {"role", "content"}))
def test_an_echoed_assistant_message_is_accepted(client, field: str) -> None:
    message = {"role": "assistant", "content": "Hello!", field: ECHOED[field]}
    reply = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
        {"role": "user", "content": "Hi"}, message, {"role": "user", "content": "And?"}])
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("where", ["body", "message"])
def test_an_unknown_field_is_still_one_sentence_naming_it(client, where: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        if where == "body":
            client.chat.completions.create(**hello(extra_body={"stor": True}))
        else:
            client.chat.completions.create(model=MODEL, max_tokens=2,
                                           messages=[{"role": "user", "content": "Hi", "refusall": None}])
    path = "stor" if where == "body" else "messages.0.refusall"
    assert err.value.body["message"] == f"Unknown parameter '{path}'; remove it."
    assert err.value.body["param"] == path


def test_models_retrieve_and_an_unknown_model_is_404(client) -> None:
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model" and card.owned_by == "frame"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-9")
    assert err.value.body["code"] == "model_not_found" and "SmolLM2-135M-Instruct" in err.value.body["message"]


def test_required_with_parallel_calls_ends_with_tool_calls(client) -> None:
    # A pydantic-ai-style output tool; a JSON array of calls made the model repeat this call until max_tokens.
    choice = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Extract: John is 42 years old."}], tools=[FINAL_RESULT],
        tool_choice="required", max_tokens=400, temperature=0).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert 1 <= len(choice.message.tool_calls) < 4
    for call in choice.message.tool_calls:
        assert call.function.name == "final_result"
        jsonschema.validate(json.loads(call.function.arguments), FINAL_RESULT["function"]["parameters"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_without_parallel_calls_makes_exactly_one(client, temperature: float) -> None:
    search = {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 20}}, "required": ["query"]}}}
    for seed in range(3):
        choice = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Look up Paris, Rome and Oslo."}],
            tools=[search, FINAL_RESULT], tool_choice="required", parallel_tool_calls=False, max_tokens=200,
            temperature=temperature, seed=seed).choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
