"""One `frame serve` with an API key (from FRAME_API_KEY): every endpoint but /health needs it; then its engine
process is killed: /health turns 503, open requests end with an error, the server itself stays up."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest

KEY = "sk-test-123"
ENDPOINTS = [("GET", "/v1/models", None), ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2}),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
             ("POST", "/tokenize", {"prompt": "Hi"}), ("POST", "/detokenize", {"tokens": [1]}),
             ("GET", "/version", None), ("GET", "/metrics", None)]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory, serve_tools):
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("keyed"), env={"FRAME_API_KEY": KEY})
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


def test_killed_engine_fails_open_requests_and_health(keyed_server):
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
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a request hung after the engine died"
    assert isinstance(outcomes["stream"], openai.APIError)
    assert "engine" in str(outcomes["stream"])
    whole_resp = outcomes["whole"]
    assert whole_resp.status_code == 503 and whole_resp.json()["error"]["code"] == "engine_dead"
    health = httpx.get(f"{keyed_server.base_url}/health").json()["error"]
    assert f"{engine_pid} exited" in health["message"]
    new = httpx.post(f"{keyed_server.base_url}/v1/completions", headers=keyed_server.headers,
                     json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
    assert new.status_code == 503
    assert keyed_server.proc.poll() is None  # the server itself is still up
    assert "engine died" in keyed_server.log_text()
