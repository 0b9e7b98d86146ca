"""Table-driven bad requests: each gets its status and the OpenAI error shape, none reaches the engine core, and a
good request works afterwards."""

from __future__ import annotations

import pytest

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"prompt": "Hello", "max_tokens": 4}
MSG = [{"role": "user", "content": "Hi"}]

# (id, method, path, json body or raw bytes, status, expected param or None, expected code or None)
CASES = [
    ("malformed-json", "POST", C, b'{"prompt": "x",', 400, None, "invalid_json"),
    ("body-not-object", "POST", C, [1, 2], 400, None, None),
    ("missing-prompt", "POST", C, {"max_tokens": 4}, 400, "prompt", None),
    ("prompt-wrong-type", "POST", C, {"prompt": 12}, 400, "prompt", None),
    ("temperature-string", "POST", C, {**OK, "temperature": "hot"}, 400, "temperature", None),
    ("temperature-negative", "POST", C, {**OK, "temperature": -1}, 400, "temperature", "invalid_sampling_params"),
    ("temperature-huge", "POST", C, {**OK, "temperature": 101}, 400, "temperature", None),
    ("top-p-zero", "POST", C, {**OK, "top_p": 0}, 400, "top_p", None),
    ("top-p-over-one", "POST", C, {**OK, "top_p": 1.5}, 400, "top_p", None),
    ("top-k-negative", "POST", C, {**OK, "top_k": -5}, 400, "top_k", None),
    ("min-p-over-one", "POST", C, {**OK, "min_p": 2.0}, 400, "min_p", None),
    ("presence-penalty", "POST", C, {**OK, "presence_penalty": 3}, 400, "presence_penalty", None),
    ("frequency-penalty", "POST", C, {**OK, "frequency_penalty": -3}, 400, "frequency_penalty", None),
    ("repetition-penalty", "POST", C, {**OK, "repetition_penalty": 0}, 400, "repetition_penalty", None),
    ("max-tokens-zero", "POST", C, {**OK, "max_tokens": 0}, 400, "max_tokens", None),
    ("max-tokens-string", "POST", C, {**OK, "max_tokens": "ten"}, 400, "max_tokens", None),
    ("min-tokens-over-max", "POST", C, {**OK, "min_tokens": 9}, 400, "min_tokens", None),
    ("n-zero", "POST", C, {**OK, "n": 0}, 400, "n", None),
    ("n-over-limit", "POST", C, {**OK, "n": 100}, 400, "n", "limit_exceeded"),
    ("n-bool", "POST", C, {**OK, "n": True}, 400, "n", None),
    ("logprobs-over-limit", "POST", C, {**OK, "logprobs": 6}, 400, "logprobs", "limit_exceeded"),
    ("stop-list-too-long", "POST", C, {**OK, "stop": [f"s{i}" for i in range(20)]}, 400, "stop", "limit_exceeded"),
    ("stop-empty-string", "POST", C, {**OK, "stop": [""]}, 400, "stop.0", None),
    ("seed-string", "POST", C, {**OK, "seed": "abc"}, 400, "seed", None),
    ("unknown-model", "POST", C, {**OK, "model": "gpt-9"}, 404, "model", "model_not_found"),
    ("too-long", "POST", C, {"prompt": "hi " * 600, "max_tokens": 900}, 400, "max_tokens", "context_length_exceeded"),
    ("empty-prompt", "POST", C, {"prompt": ""}, 400, "prompt", None),
    ("empty-prompt-list", "POST", C, {"prompt": []}, 400, "prompt", None),
    ("empty-token-list", "POST", C, {"prompt": [[]]}, 400, "prompt.0", None),
    ("token-out-of-vocab", "POST", C, {"prompt": [1, 99_999_999]}, 400, "prompt", None),
    ("token-negative", "POST", C, {"prompt": [-1]}, 400, "prompt.0", None),
    ("stop-token-out-of-vocab", "POST", C, {**OK, "stop_token_ids": [10**9]}, 400, "stop_token_ids", None),
    ("cache-salt-empty", "POST", C, {**OK, "cache_salt": ""}, 400, "cache_salt", None),
    ("cache-salt-long", "POST", C, {**OK, "cache_salt": "x" * 300}, 400, "cache_salt", None),
    ("cache-salt-nonprintable", "POST", C, {**OK, "cache_salt": "a\x00b"}, 400, "cache_salt", None),
    ("unknown-field", "POST", C, {**OK, "temprature": 0.5}, 400, "temprature", None),
    ("unknown-field-starting-with-str", "POST", C, {**OK, "structure": {"json": {}}}, 400,
     "structure", None),
    ("structured-outputs-with-two-constraints", "POST", C,
     {**OK, "structured_outputs": {"regex": "a", "choice": ["a"]}}, 400, "structured_outputs", None),
    ("regex-that-cannot-compile", "POST", C, {**OK, "structured_outputs": {"regex": "a(b"}}, 400,
     "structured_outputs.regex", None),
    ("regex-count-past-32-bits", "POST", C, {**OK, "structured_outputs": {"regex": "a{4294967296}"}}, 400,
     "structured_outputs.regex", None),
    ("grammar-count-past-32-bits", "POST", C, {**OK, "structured_outputs": {"grammar": 'root ::= "a"{0,4294967296}'}},
     400, "structured_outputs.grammar", None),
    ("speculation-not-configured", "POST", C, {**OK, "num_speculative_tokens": 2}, 400, "num_speculative_tokens",
     None),
    ("logit-bias-not-a-token-id", "POST", C, {**OK, "logit_bias": {"hello": -100}}, 400, "logit_bias", None),
    ("logit-bias-past-the-vocabulary", "POST", C, {**OK, "logit_bias": {"50256": -100}}, 400, "logit_bias", None),
    ("logit-bias-out-of-range", "POST", CHAT, {"messages": MSG, "logit_bias": {"42": 101}}, 400, "logit_bias",
     None),
    ("echo-logprobs-streamed", "POST", C, {**OK, "echo": True, "logprobs": 1, "stream": True}, 400, "stream",
     "unsupported"),
    ("prompt-logprobs-over", "POST", C, {**OK, "prompt_logprobs": 21}, 400, "prompt_logprobs", None),
    ("stream-options-without-stream", "POST", C, {**OK, "stream_options": {"include_usage": True}}, 400,
     "stream_options", None),
    ("best-of", "POST", C, {**OK, "best_of": 3}, 400, "best_of", None),
    ("chat-no-messages", "POST", CHAT, {"messages": []}, 400, "messages", None),
    ("chat-bad-role", "POST", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None, None),
    ("chat-image-part", "POST", CHAT,
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None, None),
    ("chat-top-logprobs-alone", "POST", CHAT, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs", None),
    ("chat-top-logprobs-over", "POST", CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 9}, 400,
     "top_logprobs", "limit_exceeded"),
    ("chat-too-long", "POST", CHAT, {"messages": MSG, "max_completion_tokens": 5000}, 400, "max_tokens",
     "context_length_exceeded"),
    ("chat-unknown-model", "POST", CHAT, {"messages": MSG, "model": "nope"}, 404, "model", "model_not_found"),
    ("detokenize-bad-id", "POST", "/detokenize", {"tokens": [10**9]}, 400, "tokens", None),
    ("tokenize-nothing", "POST", "/tokenize", {}, 400, "prompt", None),
    ("unknown-route", "GET", "/v1/engines", None, 404, None, None),
    ("wrong-method", "GET", C, None, 405, None, None),
]


@pytest.mark.parametrize(("name", "method", "path", "body", "status", "param", "code"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_request(mp_server, name, method, path, body, status, param, code):
    with mp_server.client() as c:
        if isinstance(body, bytes):
            resp = c.request(method, path, content=body, headers={"content-type": "application/json"})
        else:
            resp = c.request(method, path, json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and len(error["message"]) > 5
    assert error["type"] == {400: "invalid_request_error", 404: "not_found_error"}.get(status, error["type"])
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code


def test_too_long_names_both_numbers(mp_server):
    with mp_server.client() as c:
        ids = c.post("/tokenize", json={"prompt": "hi " * 600}).json()["tokens"]
        resp = c.post(C, json={"prompt": ids, "max_tokens": 900})
    message = resp.json()["error"]["message"]
    assert f"maximum context length is 1024 tokens, but the prompt has {len(ids)} tokens" in message
    assert "asks for 900 more" in message


def test_bad_requests_never_reach_the_engine_and_a_good_one_works(mp_server, metrics):
    before = metrics(mp_server)
    with mp_server.client() as c:
        for _, method, path, body, *_ in CASES:
            if isinstance(body, bytes):
                c.request(method, path, content=body, headers={"content-type": "application/json"})
            else:
                c.request(method, path, json=body)
        middle = metrics(mp_server)
        good = c.post(C, json={"prompt": "Hello", "max_tokens": 4, "temperature": 0})
    for counter in ("frame_prefix_cache_queries_total{rank=0}", "frame_engine_steps_total{rank=0}"):
        assert middle[counter] == before[counter]
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 4
