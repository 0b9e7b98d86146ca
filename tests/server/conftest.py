"""Fixtures of the server tests: real `frame serve` processes and an in-process server on free local ports.

Servers are shared per session (model load takes seconds); tests that break a server (kill its engine, drain it)
start their own. Every server runs one torch thread, a 1024-token context and a small KV pool, to stay fast on a
shared two-core machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

# float32: greedy equality across batch shapes and processes is what these tests check. Decode graphs record on
# first use, as offline: recording all 20 buckets at start would add seconds to each of the suite's servers.
ENGINE_ARGS = ["--max-model-len", "1024", "--num-kv-blocks", "512", "--platform-opt", "threads=1", "--dtype", "float32",
               "--no-record-graphs-at-start"]
START_TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running server: its URL, and its process when it is a `frame serve` subprocess."""

    base_url: str
    proc: subprocess.Popen | None = None
    log: Path | None = None
    app: object = None
    api_key: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=120, **kwargs)

    def engine_pid(self) -> int:
        with self.client() as c:
            return c.get("/version").json()["engine_pid"]

    def log_text(self) -> str:
        return self.log.read_text() if self.log else ""


def wait_healthy(server: Server, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"frame serve exited with {server.proc.returncode}:\n{server.log_text()[-3000:]}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server did not become healthy:\n{server.log_text()[-3000:]}")


def start_serve(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> Server:
    """Start `frame serve` in a subprocess and wait until /health answers 200."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "frame.cli.main", "serve", "--port", str(port), *ENGINE_ARGS, *extra]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_healthy(server)
    except Exception:
        stop_serve(server)
        raise
    return server


def stop_serve(server: Server) -> None:
    if server.proc is not None and server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(30)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait()


#: The limits the hostile-request tests probe: request templates are trusted here (so that their time and size
#: limits are what refuses them), with short time limits so those tests stay quick.
LIMITS = {"tokenize_timeout_s": 3.0, "header_timeout_s": 3.0, "body_timeout_s": 3.0, "inproc_max_connections": 80}
MP_ARGS = ["--max-n", "8", "--max-logprobs", "5", "--max-waiting-requests", "256", "--trust-request-chat-template",
           "--tokenize-timeout", str(LIMITS["tokenize_timeout_s"]), "--header-timeout", str(LIMITS["header_timeout_s"]),
           "--body-timeout", str(LIMITS["body_timeout_s"]), "--enable-reset-prefix-cache"]


@pytest.fixture(scope="session")
def mp_server(tmp_path_factory) -> Server:
    """`frame serve` with the engine core in its own process (the default)."""
    server = start_serve(tmp_path_factory.mktemp("mp"), *MP_ARGS)
    yield server
    stop_serve(server)


@pytest.fixture(scope="session")
def inproc_server() -> Server:
    """The same app with ``--engine inproc`` and the default template and time limits, served by uvicorn in a
    thread of the test process."""
    from frame.config import build_config
    from frame.server import HttpLimits, ServerLimits, ServerSettings, build_app
    from frame.server.runner import server_for

    config = build_config(max_model_len=1024, num_kv_blocks=512, platform_options={"threads": 1}, dtype="float32")
    app = build_app(config, ServerSettings(engine_mode="inproc",
                                           limits=ServerLimits(max_n=8, max_waiting_requests=256)))
    port = free_port()
    uv = server_for(app, "127.0.0.1", port, drain_timeout_s=5, log_level="warning",
                    http=HttpLimits(max_connections=LIMITS["inproc_max_connections"]))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    server = Server(f"http://127.0.0.1:{port}", app=app)
    wait_healthy(server)
    yield server
    uv.should_exit = True
    thread.join(30)


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text to {sample name (with labels): value}, through prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


@pytest.fixture
def metrics():
    """``metrics(server)``: the server's /metrics as a dict of sample values."""

    def read(server: Server) -> dict[str, float]:
        with server.client() as c:
            resp = c.get("/metrics")
            assert resp.status_code == 200
            return metric_values(resp.text)

    return read


@pytest.fixture(scope="session")
def limits() -> dict[str, float]:
    """The time and connection limits the shared servers run with."""
    return LIMITS


@pytest.fixture(scope="session")
def chat_text(mp_server) -> Callable[[list[dict], int], str]:
    """``chat_text(messages, max_tokens)``: /v1/chat/completions' greedy answer on ``mp_server``, which the
    Responses and Messages APIs must give for the same conversation."""
    import openai

    client = openai.OpenAI(base_url=f"{mp_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)

    def answer(messages: list[dict], max_tokens: int) -> str:
        return client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages,
                                              max_tokens=max_tokens, temperature=0).choices[0].message.content

    return answer


@pytest.fixture(scope="session")
def serve_tools():
    """``(start_serve, stop_serve)`` for tests that need a server of their own (importlib mode hides conftest)."""
    return start_serve, stop_serve


#: 32 distinct prompts for the data-parallel tests: greedy, a few tokens each, sent all at once.
DP_PROMPTS = [f"Question {i}: in one short sentence, what is {topic}?" for i, topic in enumerate(
    ["a river", "a mountain", "a star", "a cloud", "bread", "a violin", "a glacier", "a desert"] * 4)]
DP_MAX_TOKENS = 8


def complete_concurrently(server: Server, prompts: list[str], max_tokens: int = DP_MAX_TOKENS) -> list[str]:
    """Every prompt sent at once through the openai client (greedy); the texts, in prompt order."""
    import asyncio

    import openai

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.api_key or "unused",
                                    max_retries=0, timeout=300)
        async with client:
            answers = await asyncio.gather(*(client.completions.create(
                model="SmolLM2-135M-Instruct", prompt=p, max_tokens=max_tokens, temperature=0) for p in prompts))
        return [a.choices[0].text for a in answers]

    return asyncio.run(run())


@pytest.fixture(scope="session")
def dp_reference(mp_server) -> list[str]:
    """The 32 data-parallel prompts' greedy completions from one engine core (the shared `mp_server`)."""
    return complete_concurrently(mp_server, DP_PROMPTS)


def routed(server: Server) -> dict[int, float]:
    """``frame_router_requests_total`` by rank."""
    with server.client() as c:
        values = metric_values(c.get("/metrics").text)
    return {int(k.split("rank=")[1].rstrip("}")): v for k, v in values.items()
            if k.startswith("frame_router_requests_total{")}


def rank_health(server: Server) -> dict[int, str]:
    """``/health``'s status of each rank."""
    body = httpx.get(f"{server.base_url}/health", timeout=5).json()
    return {r["rank"]: r["status"] for r in body.get("ranks", [])}


def kill_a_serving_rank(server: Server, kill: Callable[[int, int], None], deadline_s: float = 10.0) -> int:
    """Start a long stream, find the rank the router gave it, ``kill(rank, pid)`` that rank's core, and check: the
    stream ends with an error naming the rank, ``/health`` says that rank is not serving, and the other rank
    serves meanwhile. Returns the killed rank."""
    import openai

    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    before = routed(server)
    outcome: dict[str, object] = {}
    streaming = threading.Event()

    def stream() -> None:
        try:
            for _ in client.completions.create(model="SmolLM2-135M-Instruct", prompt="Count: 1, 2, 3,",
                                               max_tokens=900, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}):
                streaming.set()
            outcome["result"] = "finished"
        except Exception as err:  # the error event the server sends when the rank dies
            outcome["result"] = err

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert streaming.wait(120), "no token streamed"
    after = routed(server)
    rank = next(r for r in after if after[r] > before.get(r, 0))
    with server.client() as c:
        pid = next(r["pid"] for r in c.get("/version").json()["ranks"] if r["rank"] == rank)
    kill(rank, pid)
    thread.join(deadline_s + 5)
    assert not thread.is_alive(), "the stream still hangs after its rank died"
    error = outcome["result"]
    assert isinstance(error, openai.APIError) and f"engine core rank {rank} died" in str(error), error
    assert rank_health(server)[rank] != "ok"
    other = 1 - rank
    served = routed(server)[other]
    done = client.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is",
                                     max_tokens=4, temperature=0)
    assert done.usage.completion_tokens == 4 and routed(server)[other] == served + 1
    return rank


def wait_rank_serves_again(server: Server, rank: int, timeout_s: float = 180.0) -> None:
    """Wait until ``/health`` says ``rank`` serves again, then check the router gives it requests and they finish."""
    deadline = time.monotonic() + timeout_s
    while rank_health(server).get(rank) != "ok":
        assert time.monotonic() < deadline, f"rank {rank} did not come back within {timeout_s:.0f} s"
        time.sleep(0.5)
    before = routed(server)[rank]
    with server.client() as c:
        for i in range(4):  # whatever the router, a live idle rank gets one of four sequential requests
            resp = c.post("/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": f"Back {i}: hello",
                                                    "max_tokens": 2, "temperature": 0})
            assert resp.status_code == 200, resp.text
    assert routed(server)[rank] > before


@pytest.fixture(scope="session")
def dp_tools():
    """What the data-parallel test modules share (importlib mode hides conftest)."""
    return SimpleNamespace(prompts=DP_PROMPTS, complete=complete_concurrently, metrics=metric_values, routed=routed,
                           health=rank_health, kill_a_serving_rank=kill_a_serving_rank,
                           wait_rank_serves_again=wait_rank_serves_again)
