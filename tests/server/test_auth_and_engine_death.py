"""One `frame serve` with two API keys (from a key file): every endpoint but /health needs one, and the two keys are
two tenants who never share cached prefixes. Then its engine process is killed: /health turns 503 (saying no more
than that), open requests end with an error, and the server restarts the engine and serves again."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

KEY, OTHER_KEY = "sk-test-123", "sk-other-456"
PER_KEY = 3
ENDPOINTS = [("GET", "/v1/models", None), ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
             ("POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 2}),
             ("POST", "/tokenize", {"prompt": "Hi"}), ("POST", "/detokenize", {"tokens": [1]}),
             ("GET", "/version", None), ("GET", "/metrics", None)]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory, serve_tools):
    start_serve, stop_serve = serve_tools
    tmp = tmp_path_factory.mktemp("keyed")
    (tmp / "keys").write_text(f"# tenants\n{KEY}\n\n{OTHER_KEY}\n")
    server = start_serve(tmp, "--api-key-file", str(tmp / "keys"), "--max-connections-per-key", str(PER_KEY))
    server.api_key = KEY
    yield server
    stop_serve(server)


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS, ids=[e[1] for e in ENDPOINTS])
def test_endpoints_refuse_missing_or_wrong_key(keyed_server, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        resp = httpx.request(method, keyed_server.base_url + path, json=body, headers=headers, timeout=60)
        assert resp.status_code == 401
        assert resp.json()["error"]["type"] == "authentication_error"
        assert resp.json()["error"]["code"] == "invalid_api_key"
    good = httpx.request(method, keyed_server.base_url + path, json=body, headers=keyed_server.headers, timeout=120)
    assert good.status_code == 200, good.text


def test_health_needs_no_key(keyed_server):
    assert httpx.get(f"{keyed_server.base_url}/health").status_code == 200


def test_openai_client_with_key(keyed_server):
    client = openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hi", max_tokens=2).usage
    bad = openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_the_messages_api_takes_the_key_as_x_api_key(keyed_server):
    import anthropic

    ask = dict(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Hi"}])
    client = anthropic.Anthropic(base_url=keyed_server.base_url, api_key=KEY, max_retries=0, timeout=120)
    assert client.messages.count_tokens(**ask).input_tokens > 0
    assert client.messages.create(max_tokens=2, **ask).usage.output_tokens == 2
    bearer = anthropic.Anthropic(base_url=keyed_server.base_url, auth_token=KEY, max_retries=0, timeout=120)
    assert bearer.messages.count_tokens(**ask).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as err:
        anthropic.Anthropic(base_url=keyed_server.base_url, api_key="nope", max_retries=0).messages.count_tokens(**ask)
    assert err.value.body == {"type": "error", "error": {
        "type": "authentication_error",
        "message": "The API key is wrong; send 'x-api-key: <key>' or 'Authorization: Bearer <key>'."}}
    # Only the Messages API's routes read x-api-key.
    assert httpx.get(f"{keyed_server.base_url}/v1/models", headers={"x-api-key": KEY}).status_code == 401


def test_tenants_never_share_cached_prefixes(keyed_server):
    prompt = "A long shared instruction that both tenants happen to send. " * 40

    def cached(key: str) -> tuple[int, int]:
        resp = httpx.post(f"{keyed_server.base_url}/v1/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"prompt": prompt, "max_tokens": 1}, timeout=120)
        usage = resp.json()["usage"]
        return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]

    first, prompt_tokens = cached(KEY)
    assert prompt_tokens > 400
    again, _ = cached(KEY)
    assert again > first and again >= prompt_tokens - 32  # the same tenant hits its own prefix
    assert cached(OTHER_KEY)[0] == 0  # the other tenant finds nothing of it


def test_prompt_tokens_details_can_be_switched_off(inproc_server):
    settings = inproc_server.app.state.frame.settings
    body = {"prompt": "Hello", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    try:
        settings.prompt_tokens_details = False  # what --no-prompt-tokens-details sets
        with inproc_server.client() as c:
            whole = c.post("/v1/completions", json={**body, "stream": False, "stream_options": None}).json()
            streamed = [line for line in c.post("/v1/completions", json=body).text.splitlines() if '"usage"' in line]
    finally:
        settings.prompt_tokens_details = True
    assert whole["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    assert "prompt_tokens_details" not in streamed[-1] and '"completion_tokens": 2' in streamed[-1]


def test_one_key_cannot_take_every_connection(keyed_server):
    """Issue 38: past --max-connections-per-key requests in flight, that key's next one is a 429 with Retry-After;
    another key is served meanwhile, and the first key is served again once its requests end. The held requests
    are ones whose body is still arriving (the server holds them until the body timeout)."""
    host, port = keyed_server.base_url.removeprefix("http://").split(":")
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").encode()
    held = [socket.create_connection((host, int(port)), timeout=30) for _ in range(PER_KEY)]
    try:
        for sock in held:
            sock.sendall(head)
        with httpx.Client(base_url=keyed_server.base_url, timeout=60) as c:
            deadline = time.monotonic() + 10
            while (refused := c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                                     headers=keyed_server.headers)).status_code != 429:
                assert time.monotonic() < deadline, f"never refused: {refused.status_code} {refused.text}"
                time.sleep(0.1)  # until the server has read every held request's head
            assert refused.headers["retry-after"] == "1", refused.headers
            error = refused.json()["error"]
            assert error["code"] == "too_many_requests" and "--max-connections-per-key" in error["message"]
            other = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                           headers={"Authorization": f"Bearer {OTHER_KEY}"})
            assert other.status_code == 200, other.text
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30
    while (again := httpx.post(f"{keyed_server.base_url}/v1/completions", headers=keyed_server.headers, timeout=60,
                               json={"prompt": "Hi", "max_tokens": 2})).status_code == 429:
        assert time.monotonic() < deadline, "the key's slots were not given back"
        time.sleep(0.2)
    assert again.status_code == 200, again.text


def test_killed_engine_fails_open_requests_and_restarts(keyed_server):
    engine_pid = keyed_server.engine_pid()
    assert engine_pid != keyed_server.proc.pid
    client = openai.OpenAI(base_url=f"{keyed_server.base_url}/v1", api_key=KEY, max_retries=0, timeout=60)
    outcomes: dict[str, object] = {}
    started = threading.Event()

    def streaming() -> None:
        try:
            for _ in client.completions.create(model="SmolLM2-135M-Instruct", prompt="Tell a story", max_tokens=500,
                                               extra_body={"ignore_eos": True}, stream=True):
                started.set()
            outcomes["stream"] = "finished"
        except openai.APIError as err:
            outcomes["stream"] = err

    def whole() -> None:
        resp = httpx.post(f"{keyed_server.base_url}/v1/completions", headers=keyed_server.headers, timeout=60,
                          json={"prompt": "Tell a story", "max_tokens": 500, "ignore_eos": True})
        outcomes["whole"] = resp

    threads = [threading.Thread(target=streaming), threading.Thread(target=whole)]
    for t in threads:
        t.start()
    assert started.wait(60)
    os.kill(engine_pid, signal.SIGKILL)
    t0 = time.monotonic()
    while httpx.get(f"{keyed_server.base_url}/health").status_code != 503:
        assert time.monotonic() - t0 < 5, "/health still 200 five seconds after the engine died"
        time.sleep(0.1)
    health_resp = httpx.get(f"{keyed_server.base_url}/health")
    assert health_resp.headers["retry-after"] == "1"
    health = health_resp.json()["error"]
    assert health["message"] == "The server is not ready to serve." and str(engine_pid) not in str(health)
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a request hung after the engine died"
    assert isinstance(outcomes["stream"], openai.APIError)
    assert "engine" in str(outcomes["stream"])
    whole_resp = outcomes["whole"]
    assert whole_resp.status_code == 503 and whole_resp.json()["error"]["code"] == "engine_dead"
    assert whole_resp.headers["retry-after"] == "1"  # issue 38: the in-flight 503s carry it too
    new = httpx.post(f"{keyed_server.base_url}/v1/completions", headers=keyed_server.headers,
                     json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
    assert new.status_code == 503 and new.headers["retry-after"] == "1"
    while httpx.get(f"{keyed_server.base_url}/health").status_code != 200:
        assert time.monotonic() - t0 < 180, "the engine was not restarted"
        time.sleep(0.5)
    assert keyed_server.engine_pid() not in (engine_pid, None)
    again = httpx.post(f"{keyed_server.base_url}/v1/completions", headers=keyed_server.headers,
                       json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 2
    assert "frame_engine_restarts_total 1.0" in httpx.get(f"{keyed_server.base_url}/metrics",
                                                          headers=keyed_server.headers).text
    assert keyed_server.proc.poll() is None
    assert "engine died" in keyed_server.log_text() and "engine restarted" in keyed_server.log_text()
