"""SIGTERM drains a `frame serve`: running requests may finish within the drain time; those that cannot end with the
error event and `[DONE]` (or a 503 for a whole response); requests arriving meanwhile get 503 in the OpenAI shape;
then server and engine exit. `frame bench serve` runs against the shared server and prints its table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx

DRAIN_S = 4
LONG = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "temperature": 0}


def sse_events(base_url: str, body: dict, first: threading.Event) -> list[str]:
    """The data lines of one streamed completion, as sent."""
    events = []
    with httpx.stream("POST", f"{base_url}/v1/completions", json={**body, "stream": True}, timeout=120) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                first.set()
    return events


def test_sigterm_drain_ends_what_it_cannot_finish(tmp_path, serve_tools):
    start_serve, _ = serve_tools
    server = start_serve(tmp_path, "--drain-timeout", str(DRAIN_S))
    engine_pid = server.engine_pid()
    results: dict[str, object] = {}
    started = {name: threading.Event() for name in ("short", "long")}

    def run(name: str, body: dict) -> None:
        results[name] = sse_events(server.base_url, body, started[name])

    def whole() -> None:
        results["whole"] = httpx.post(f"{server.base_url}/v1/completions", json=LONG, timeout=120)

    threads = [threading.Thread(target=run, args=("short", {**LONG, "max_tokens": 4})),
               threading.Thread(target=run, args=("long", LONG)), threading.Thread(target=whole)]
    try:
        for t in threads:
            t.start()
        assert started["long"].wait(60) and started["short"].wait(60)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        during = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
        assert during.status_code == 503 and during.json()["error"]["code"] == "server_draining"
        assert during.headers["retry-after"] == "1" and during.headers["connection"] == "close"
        assert httpx.get(f"{server.base_url}/health").status_code == 503
        for t in threads:
            t.join(120)
        short = [json.loads(e) for e in results["short"][:-1]]
        assert results["short"][-1] == "[DONE]" and short[-1]["choices"][0]["finish_reason"] == "length"
        long = results["long"]
        assert long[-1] == "[DONE]"
        assert json.loads(long[-2])["error"]["code"] == "server_draining"
        assert results["whole"].status_code == 503
        assert results["whole"].json()["error"]["code"] == "server_draining"
        assert server.proc.wait(60) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)  # the signal, raised again
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the engine process outlived its server")
    assert "draining" in server.log_text() and "drain timed out: ending 2 request(s)" in server.log_text()


def test_bench_serve_prints_its_table(mp_server):
    cmd = [sys.executable, "-m", "frame.bench.serve", "--base-url", mp_server.base_url, "--num-prompts", "6",
           "--concurrency", "3", "--input-len", "12", "--output-len", "6"]
    table = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr
    for word in ("request throughput", "output throughput", "TTFT", "TPOT", "ITL", "6 / 0"):
        assert word in table.stdout
    as_json = subprocess.run([*cmd, "--json", "-", "--request-rate", "20"], capture_output=True, text=True,
                             timeout=300)
    summary = json.loads(as_json.stdout)
    assert summary["completed"] == 6 and summary["failed"] == 0
    assert summary["output_tokens"] == 36
    assert 0 < summary["p50_ttft_ms"] <= summary["p99_ttft_ms"]
    assert summary["p50_itl_ms"] > 0 and summary["request_throughput"] > 0


def test_bench_serve_datasets_of_token_ids(mp_server):
    base = [sys.executable, "-m", "frame.bench.serve", "--base-url", mp_server.base_url, "--json", "-"]
    random_ids = subprocess.run([*base, "--dataset", "random", "--num-prompts", "3", "--input-len", "20",
                                 "--output-len", "4", "--endpoint", "chat"], capture_output=True, text=True,
                                timeout=300)
    summary = json.loads(random_ids.stdout)
    assert (summary["dataset"], summary["completed"], summary["output_tokens"]) == ("random", 3, 12)
    turns = subprocess.run([*base, "--dataset", "multi_turn", "--concurrency", "2",
                            *[f"--dataset-opt={kv}" for kv in ("num_conversations=2", "num_turns=3", "max_tokens=3",
                                                               "system_len=16")]],
                           capture_output=True, text=True, timeout=300)
    summary = json.loads(turns.stdout)
    assert (summary["completed"], summary["failed"], summary["output_tokens"]) == (6, 0, 18)
    wrong = subprocess.run([*base, "--dataset", "no_such_workload"], capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and "No workload named 'no_such_workload'" in wrong.stderr
