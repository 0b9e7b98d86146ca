"""SIGTERM drains a `frame serve` (running requests finish, then server and engine exit); `frame bench serve`
runs against the shared server and prints its table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import openai


def test_sigterm_drains_running_requests(tmp_path, serve_tools):
    start_serve, _ = serve_tools
    server = start_serve(tmp_path, "--drain-timeout", "60")
    engine_pid = server.engine_pid()
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    first = threading.Event()
    result: dict[str, object] = {}

    def stream() -> None:
        text, finish = "", None
        for chunk in client.completions.create(model="SmolLM2-135M-Instruct", prompt="Once upon a time",
                                               max_tokens=24, extra_body={"ignore_eos": True}, stream=True,
                                               stream_options={"include_usage": True}):
            first.set()
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                result["tokens"] = chunk.usage.completion_tokens
        result["finish"] = finish

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert first.wait(60)
        server.proc.send_signal(signal.SIGTERM)
        thread.join(120)
        assert result == {"finish": "length", "tokens": 24}
        assert server.proc.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
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
    assert "draining" in server.log_text()


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
