"""Rendering is fair (issue 36): clients sending slow request templates cannot hold every render worker.

The shared `frame serve` trusts request templates, renders with two workers and a 3 s limit. Four clients each send
a template that spins until that limit (and gets its worker killed and replaced); meanwhile ordinary chat requests
(the model's own template) keep the latency they have on a quiet server, within 2 s.
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx

CHAT = "/v1/chat/completions"
PLAIN = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


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
