"""The official openai client against `frame serve` (engine in a child process): shapes, streaming, equality with
the offline LLM for the same prompt token ids."""

from __future__ import annotations

import openai
import pytest

PROMPTS = ["The capital of France is", "Once upon a time, there was a", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def client(mp_server):
    return openai.OpenAI(base_url=f"{mp_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def offline():
    from frame import LLM

    return LLM(max_model_len=1024, num_kv_blocks=512, platform_options={"threads": 1}, dtype="float32")


def test_models_lists_the_served_model(client, model):
    assert model == "SmolLM2-135M-Instruct"
    assert client.models.list().data[0].owned_by == "frame"


def test_greedy_completion_equals_offline_llm(client, model, offline):
    from frame import SamplingParams

    tok = offline.get_tokenizer()
    for text in PROMPTS:
        ids = list(tok(text).input_ids)
        want = offline.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=16))[0]
        got = client.completions.create(model=model, prompt=ids, max_tokens=16, temperature=0)
        assert got.choices[0].text == want.outputs[0].text
        assert got.choices[0].finish_reason == want.outputs[0].finish_reason
        assert got.usage.prompt_tokens == len(ids)
        assert got.usage.completion_tokens == len(want.outputs[0].token_ids)
        assert got.usage.total_tokens == len(ids) + len(want.outputs[0].token_ids)


def test_greedy_chat_equals_offline_llm(client, model, offline):
    from frame import SamplingParams

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    want = offline.chat(messages, SamplingParams(temperature=0, max_tokens=16))[0].outputs[0]
    got = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
    assert got.object == "chat.completion"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.usage.completion_tokens == len(want.token_ids)


def test_streaming_completion_concatenates_to_the_whole(client, model):
    whole = client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_streaming_chat_with_usage(client, model):
    messages = [{"role": "user", "content": "Say hello."}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_n_seed_and_extensions(client, model):
    kwargs = dict(model=model, prompt=PROMPTS[0], max_tokens=8, temperature=1.0, top_p=0.9, n=3, seed=7,
                  presence_penalty=0.5, frequency_penalty=0.5,
                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": True,
                              "cache_salt": "tenant-a", "priority": 1})
    first, second = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]  # seeded
    assert first.usage.completion_tokens == 24
    assert all(c.finish_reason == "length" for c in first.choices)


def test_completion_logprobs_shape(client, model):
    got = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=5, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == got.choices[0].text
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 3 <= len(top) <= 4 and value <= 0.0
        assert max(top.values()) == pytest.approx(value)  # greedy: the sampled token is the most likely
        assert top[token] == pytest.approx(value)


def test_chat_logprobs_shape(client, model):
    got = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                         temperature=0, logprobs=True, top_logprobs=2)
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].token == item.token
        assert bytes(item.bytes).decode() == item.token


def test_stop_strings_and_batched_prompts(client, model):
    got = client.completions.create(model=model, prompt=[PROMPTS[0], PROMPTS[1]], max_tokens=16, temperature=0,
                                    stop=["."])
    assert [c.index for c in got.choices] == [0, 1]
    first = got.choices[0]
    assert "." not in first.text and first.finish_reason == "stop"
    assert got.usage.prompt_tokens > 8


def test_max_completion_tokens_and_single_stop_string(client, model):
    got = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count: 1, 2, 3,"}],
                                         max_completion_tokens=6, temperature=0, stop="zzz")
    assert got.usage.completion_tokens <= 6


def test_tokenize_detokenize_round_trip(mp_server, offline):
    with mp_server.client() as c:
        ids = c.post("/tokenize", json={"prompt": PROMPTS[2]}).json()
        assert ids["tokens"] == list(offline.get_tokenizer()(PROMPTS[2]).input_ids)
        assert ids["count"] == len(ids["tokens"]) and ids["max_model_len"] == 1024
        assert c.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == PROMPTS[2]
        chat = c.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}).json()
        assert chat["count"] > 5
        version = c.get("/version").json()
        assert version["engine_mode"] == "mp" and version["engine_pid"] != mp_server.proc.pid


def test_tokenize_renders_the_chat_template_as_transformers_does(mp_server, offline):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    want = offline.get_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)
    with mp_server.client() as c:
        got = c.post("/tokenize", json={"messages": messages}).json()["tokens"]
    assert got == list(want)
