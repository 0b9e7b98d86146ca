"""`frame serve --on-engine-death exit`: when the engine process dies, open streams end with the error event and
`[DONE]`, and the server exits with status 1 so that the supervisor outside (systemd, Kubernetes) restarts it."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx


def test_engine_death_ends_the_server_with_status_1(tmp_path, serve_tools):
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path, "--on-engine-death", "exit")
    events: list[str] = []
    first = threading.Event()

    def stream() -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    first.set()

    thread = threading.Thread(target=stream)
    try:
        thread.start()
        assert first.wait(60)
        os.kill(server.engine_pid(), signal.SIGKILL)
        assert server.proc.wait(60) == 1
        thread.join(30)
        assert not thread.is_alive()
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "engine_dead"
        assert "engine died; exiting (--on-engine-death exit)" in server.log_text()
    finally:
        stop_serve(server)
