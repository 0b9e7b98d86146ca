"""`frame serve --tensor-parallel-size 2`: it serves, and when one model worker is SIGKILLed mid-generation, the
open request ends with an error and /health turns 503 within 10 s; nothing hangs."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai

DEADLINE_S = 10.0


def worker_pids(engine_pid: int) -> dict[int, int]:
    """``rank -> pid`` of the engine process's model worker processes."""
    workers = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == engine_pid and b"frame.engine.worker.proc" in argv:
            workers[int(argv[argv.index(b"--rank") + 1])] = int(entry.name)
    return workers


def test_two_ranks_serve_and_a_killed_worker_fails_requests_and_health(tmp_path_factory, serve_tools) -> None:
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("tp"), "--tensor-parallel-size", "2")
    try:
        workers = worker_pids(server.engine_pid())
        assert sorted(workers) == [0, 1], workers
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        done = client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                         max_tokens=8, temperature=0)
        assert done.usage.completion_tokens == 8

        outcome: dict[str, object] = {}
        streaming = threading.Event()

        def stream() -> None:
            try:
                chunks = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Count: 1, 2, 3,",
                                                   max_tokens=900, temperature=0, stream=True,
                                                   extra_body={"ignore_eos": True})
                for _ in chunks:
                    streaming.set()
                outcome["result"] = "finished"
            except Exception as err:  # the error event the server sends when the engine dies
                outcome["result"] = err
            outcome["at"] = time.monotonic()

        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        assert streaming.wait(60), "no token streamed"
        os.kill(workers[1], signal.SIGKILL)
        killed = time.monotonic()
        thread.join(DEADLINE_S + 5)
        assert not thread.is_alive(), "the stream still hangs after the worker died"
        assert isinstance(outcome["result"], openai.APIError), outcome
        assert outcome["at"] - killed < DEADLINE_S  # type: ignore[operator]
        while time.monotonic() - killed < DEADLINE_S:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 503:
                break
            time.sleep(0.2)
        assert httpx.get(f"{server.base_url}/health", timeout=2).status_code == 503
        assert "model worker of rank 1" in server.log_text()
    finally:
        stop_serve(server)
