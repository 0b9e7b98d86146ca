"""The requests of issue 15 that a hostile client sent to a real `frame serve`, in both engine forms: each is a 4xx
in the OpenAI shape naming the field or the limit, the engine survives them all, and a good request afterwards
gets the same greedy answer as before. The two template attacks are refused within the time limit while
`/health` keeps answering."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

C, CHAT = "/v1/completions", "/v1/chat/completions"
OK = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
MSG = [{"role": "user", "content": "Hi"}]
LOOP_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HUGE_TEMPLATE = "{{ 'hello world ' * 1000000 }}"
TOKEN_LISTS = [[1, 2, 3]] * 64

# (id, path, body, status, param or None, code or None for mp, code or None for inproc)
CASES = [
    ("template-loop", CHAT, {"messages": MSG, "chat_template": LOOP_TEMPLATE}, 400, None,
     "template_timeout", "chat_template_not_allowed"),
    ("template-huge", CHAT, {"messages": MSG, "chat_template_kwargs": {"chat_template": HUGE_TEMPLATE}}, 400, None,
     "template_too_large", "chat_template_not_allowed"),
    ("return-tensors", CHAT, {"messages": MSG, "chat_template_kwargs": {"return_tensors": "pt"}}, 400,
     "chat_template_kwargs", None, None),
    ("tokenizer-kwargs", CHAT, {"messages": MSG, "chat_template_kwargs": {"tokenizer_kwargs": {"x": 1}}}, 400,
     "chat_template_kwargs", None, None),
    ("seed-2^64", C, {**OK, "seed": 2**64}, 400, "seed", None, None),
    ("seed-below-int64", C, {**OK, "seed": -(2**63) - 1}, 400, "seed", None, None),
    ("seed-max-with-n-2", C, {**OK, "seed": 2**64 - 1, "n": 2}, 400, "seed", None, None),
    ("priority-2^64", C, {**OK, "priority": 2**64}, 400, "priority", None, None),
    ("top-k-2^64", C, {**OK, "top_k": 2**64}, 400, "top_k", None, None),
    ("surrogate-prompt", C, {**OK, "prompt": "a\ud800b"}, 400, "prompt", None, None),
    ("surrogate-stop", C, {**OK, "stop": ["a\ud800b"]}, 400, "stop.0", None, None),
    ("surrogate-model", C, {**OK, "model": "a\ud800b"}, 400, "model", None, None),
    ("surrogate-tokenize", "/tokenize", {"prompt": "a\ud800b"}, 400, "prompt", None, None),
    ("surrogate-message", CHAT, {"messages": [{"role": "user", "content": "a\udfffb"}]}, 400,
     "messages.0.content", None, None),
    ("surrogate-template-kwarg", CHAT, {"messages": MSG, "chat_template_kwargs": {"x": ["a\ud800"]}}, 400,
     "chat_template_kwargs", None, None),
    ("never-fits", C, {"prompt": TOKEN_LISTS, "n": 8, "max_tokens": 2}, 400, "n", "limit_exceeded",
     "limit_exceeded"),
    ("stop-strings-too-long", C, {**OK, "stop": ["x" * 3000, "y" * 3000]}, 400, "stop", "limit_exceeded",
     "limit_exceeded"),
    ("stop-strings-48MB", C, {**OK, "stop": ["z" * 3_000_000] * 16}, 413, None, "request_too_large",
     "request_too_large"),
    ("prompt-too-many-chars", C, {**OK, "prompt": "word " * 300_000}, 400, "prompt", "limit_exceeded",
     "limit_exceeded"),
    ("stream-wrong-type", C, {**OK, "stream": "yes"}, 400, "stream", None, None),
    ("stream-options-wrong-type", C, {**OK, "stream": True, "stream_options": 5}, 400, "stream_options", None, None),
]


def _reference(client: httpx.Client) -> str:
    resp = client.post(C, json=OK)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def _engine_id(server) -> object:
    if server.app is not None:  # in-process: the client object is replaced when the engine restarts
        return id(server.app.state.frame.client)
    return server.engine_pid()


@pytest.mark.parametrize("server_fixture", ["mp_server", "inproc_server"])
def test_hostile_requests_are_4xx_and_the_engine_survives(request, server_fixture):
    server = request.getfixturevalue(server_fixture)
    engine = _engine_id(server)
    with server.client() as c:
        before = _reference(c)
        for name, path, body, status, param, mp_code, inproc_code in CASES:
            # json.dumps escapes a lone surrogate as JSON allows ("\\ud800"); httpx's encoder would refuse it.
            resp = c.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            assert resp.status_code == status, (name, resp.text)
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, name
            assert error["type"] == "invalid_request_error", name
            assert len(error["message"]) > 20 and error["message"].endswith("."), (name, error["message"])
            if param is not None:
                assert error["param"] == param, (name, error)
            code = mp_code if server_fixture == "mp_server" else inproc_code
            if code is not None:
                assert error["code"] == code, (name, error)
        assert _reference(c) == before
        deadline = time.monotonic() + 30  # a template worker killed at its time limit is being replaced
        while (health := c.get("/health").json())["status"] != "ok" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert health == {"status": "ok", "ranks": [{"rank": 0, "status": "ok"}],
                          "render_workers": {"size": 2, "missing": 0}}
    assert _engine_id(server) == engine  # the same engine answered: none of it ended the engine


@pytest.mark.parametrize(("template", "kwargs", "code"), [
    (LOOP_TEMPLATE, None, "template_timeout"),
    (None, {"chat_template": HUGE_TEMPLATE}, "template_too_large"),
], ids=["nested-loops", "huge-string"])
def test_template_attacks_are_refused_while_health_answers(mp_server, limits, template, kwargs, code):
    result: dict[str, object] = {}

    def attack() -> None:
        t0 = time.monotonic()
        body = {"messages": MSG, "chat_template": template, "chat_template_kwargs": kwargs}
        result["resp"] = httpx.post(f"{mp_server.base_url}{CHAT}", json=body, timeout=120)
        result["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=attack)
    thread.start()
    slowest = 0.0
    with httpx.Client(base_url=mp_server.base_url, timeout=30) as c:
        while thread.is_alive():
            t0 = time.monotonic()
            assert c.get("/health").status_code == 200
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.1)
    thread.join()
    resp = result["resp"]
    assert resp.status_code == 400 and resp.json()["error"]["code"] == code, resp.text
    # The render is cut at the limit: the answer comes at the limit, plus a generous margin for a busy machine.
    assert result["seconds"] < limits["tokenize_timeout_s"] + 20
    assert slowest < 1.0, f"/health took {slowest:.2f} s while a template rendered"
