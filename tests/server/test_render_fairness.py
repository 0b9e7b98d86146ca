"""Rendering is fair (issue 36): clients sending slow request templates cannot hold every render worker.

The shared `frame serve` trusts request templates, renders with two workers and a 3 s limit. Four clients each send
a template that spins until that limit (and gets its worker killed and replaced); meanwhile ordinary chat requests
(the model's own template) keep the latency they have on a quiet server, within 2 s. A server of its own, with three
workers (two places for request templates, one each per client), shows the per-client cap: one client address
flooding slow templates holds one place, and another address's own templates render as fast as on a quiet server.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx

CHAT = "/v1/chat/completions"
PLAIN = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
#: A request template that renders at once: each message's text, then the assistant's turn.
QUICK_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
                 "<|im_start|>assistant\n"


def _ordinary(c: httpx.Client) -> float:
    started = time.monotonic()
    resp = c.post(CHAT, json=PLAIN)
    assert resp.status_code == 200, resp.text
    return time.monotonic() - started


def test_slow_request_templates_leave_ordinary_chats_their_quiet_latency(mp_server) -> None:
    with mp_server.client() as c:
        _ordinary(c)  # warm
        quiet = statistics.median(_ordinary(c) for _ in range(5))
    stop = threading.Event()
    codes: list[str] = []

    def hostile() -> None:
        with mp_server.client() as c:
            while not stop.is_set():
                resp = c.post(CHAT, json={**PLAIN, "chat_template": SLOW_TEMPLATE})
                codes.append(resp.json()["error"]["code"] if resp.status_code != 200 else "ok")
                if resp.status_code == 429:  # one address: past its render cap, it waits as Retry-After says
                    time.sleep(float(resp.headers["retry-after"]))

    clients = [threading.Thread(target=hostile) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        time.sleep(1.0)  # the slow templates hold their workers now
        with mp_server.client() as c:
            busy = [_ordinary(c) for _ in range(8)]
            health = c.get("/health").json()
    finally:
        stop.set()
        for thread in clients:
            thread.join(60)
    assert max(busy) <= quiet + 2.0, (quiet, busy)
    assert "template_timeout" in codes, codes  # the slow templates did run into the limit meanwhile
    assert health["render_workers"]["size"] == 2, health
    with mp_server.client() as c:  # the pool is whole again afterwards
        deadline = time.monotonic() + 30
        while c.get("/health").json()["render_workers"]["missing"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.get("/health").json()["render_workers"]["missing"] == 0


def _from(server, address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any 127.x.y.z reaches a server on 127.0.0.1)."""
    return httpx.Client(base_url=server.base_url, timeout=120, transport=httpx.HTTPTransport(local_address=address))


def _own_template(c: httpx.Client) -> float:
    started = time.monotonic()
    resp = c.post(CHAT, json={**PLAIN, "chat_template": QUICK_TEMPLATE})
    assert resp.status_code == 200, resp.text
    return time.monotonic() - started


def test_one_client_flooding_slow_templates_leaves_another_clients_templates_prompt(tmp_path, serve_tools) -> None:
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path, "--trust-request-chat-template", "--tokenizer-workers", "3", "--tokenize-timeout",
                         "3")
    try:
        with _from(server, "127.0.0.3") as polite:
            _own_template(polite)  # warm
            quiet = statistics.median(_own_template(polite) for _ in range(5))
        stop = threading.Event()
        answers: list[tuple[int, str]] = []

        def flood() -> None:
            with _from(server, "127.0.0.2") as c:
                while not stop.is_set():
                    resp = c.post(CHAT, json={**PLAIN, "chat_template": SLOW_TEMPLATE})
                    answers.append((resp.status_code, resp.text))
                    if resp.status_code == 429:
                        time.sleep(float(resp.headers["retry-after"]))

        flooders = [threading.Thread(target=flood) for _ in range(4)]
        for thread in flooders:
            thread.start()
        try:
            time.sleep(1.0)  # a slow template holds its place in the lane now
            with _from(server, "127.0.0.3") as polite:
                busy = [_own_template(polite) for _ in range(6)]
        finally:
            stop.set()
            for thread in flooders:
                thread.join(60)
    finally:
        stop_serve(server)
    assert max(busy) <= quiet + 2.0, (quiet, busy)
    codes = {(status, body.split('"code":')[1].split('"')[1]) for status, body in answers if status != 200}
    assert (400, "template_timeout") in codes and (429, "too_many_requests") in codes, codes
    refused = next(body for status, body in answers if status == 429)
    assert "--max-template-renders-per-client" in refused, refused
