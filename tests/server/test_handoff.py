"""Issue 38: what goes to the chat-template workers is checked first, and the pool of workers heals.

Integers past 64 bits (msgpack's range) in ``chat_template_kwargs``, a tool's ``parameters`` or an earlier tool
call's ``arguments`` are a 400 naming the exact field, and cost no worker: more such requests than the server has
workers leave chat completions answering. A worker killed from outside is replaced within 5 s, and ``/health``
says ``degraded`` meanwhile.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CHAT = "/v1/chat/completions"
WIDE = 2**70
MSG = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "maximum": WIDE}}}}}
EARLIER_CALL = [{"role": "user", "content": "Pick a number."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "pick", "arguments": f'{{"n": {WIDE}}}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
PLAIN = {"messages": MSG, "max_tokens": 4, "temperature": 0}


def render_worker_pids(server_pid: int) -> set[int]:
    """Process ids of the server's chat-template workers (its children running ``frame.server.render_worker``)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
        if ppid == server_pid and b"frame.server.render_worker" in cmdline:
            pids.add(int(entry.name))
    return pids


def test_wide_integers_are_400_naming_the_field_and_chat_keeps_answering(mp_server) -> None:
    cases = [
        ({"messages": MSG, "chat_template_kwargs": {"n": WIDE}}, "chat_template_kwargs.n"),
        ({"messages": MSG, "chat_template_kwargs": {"deep": [{"x": -WIDE}]}}, "chat_template_kwargs.deep[0].x"),
        ({"messages": MSG, "tools": [TOOL]}, "tools[0].function.parameters.properties.n.maximum"),
        ({"messages": EARLIER_CALL}, "messages[1].tool_calls[0].function.arguments.n"),
    ]
    with mp_server.client() as c:
        for body, param in cases * 2:  # twice each: more than the two workers the server has
            resp = c.post(CHAT, json={**body, "max_tokens": 4})
            assert resp.status_code == 400, resp.text
            error = resp.json()["error"]
            assert error["param"] == param and "64-bit" in error["message"], error
        tokenized = c.post("/tokenize", json={"messages": EARLIER_CALL})
        assert tokenized.status_code == 400 and tokenized.json()["error"]["param"].startswith("messages[1]")
        t0 = time.monotonic()
        resp = c.post(CHAT, json=PLAIN)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 4
        assert time.monotonic() - t0 < 60  # answered, not queued behind lost workers until the 130 s timeout
        assert c.post("/tokenize", json={"messages": MSG}).status_code == 200
        assert c.get("/health").json()["render_workers"] == {"size": 2, "missing": 0}


def test_a_render_worker_killed_from_outside_is_replaced_within_5_s(mp_server) -> None:
    before = render_worker_pids(mp_server.proc.pid)
    assert len(before) == 2
    victim = min(before)
    statuses = []
    with mp_server.client() as c:
        assert c.get("/health").json()["status"] == "ok"  # the connection open before the kill
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        while True:
            # The workers first, then the health: a health taken before the pool noticed the kill ("ok") and a scan
            # after the successor had started once ended the loop without a "degraded" (the suite's host loaded).
            # Seen in this order, a successor in the scan means the pool had noticed before the health was asked.
            now = render_worker_pids(mp_server.proc.pid)
            health = c.get("/health").json()
            statuses.append(health["status"])
            if health["render_workers"]["missing"] == 0 and len(now) == 2 and victim not in now:
                break
            assert time.monotonic() - t0 < 5.0, f"not replaced within 5 s: {health}, workers {now}"
            time.sleep(0.02)
        assert "degraded" in statuses and statuses[-1] == "ok", statuses
        assert now - before and before - now == {victim}
        resp = c.post(CHAT, json=PLAIN)
        assert resp.status_code == 200, resp.text
