"""A hostile soak of `frame serve`: valid, malformed and costly requests mixed, then whether memory comes back.

    .venv/bin/python benchmarks/soak.py [--requests 1000] [--concurrency 8] [--json out.json] [-- SERVE_ARGS...]

Starts its own `frame serve` (the bundled model, request templates trusted so slow templates are part of the mix),
then, after one constrained request and one request template (one-time costs: the grammar backend's tables), a
quiet run of valid chat requests alone, from as many clients as the soak has sending valid ones (their latency
without the hostile load); the soak, ``--requests`` requests from
``--concurrency`` clients, about 40% valid (chat and completions, a few tokens), 35% malformed (bad JSON, unknown
fields, values out of range, tool-call arguments nested 2,000 deep, a body nested 100,000 deep) and 25% costly (a
1 MB choice, a 400-deep schema, ``a{99999999999}``, distinct 2,000-branch regexes, slow request templates, 300,000
stop token ids, 3 MB prompts); then an idle wait. It reports the status counts, engine deaths, the valid requests'
latency p50/p99 during the soak against the quiet run, and the resident memory of every process of the server (API
server, engine core, render workers) before, at its peak during, and after.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

SERVE = [sys.executable, "-m", "frame.cli.main", "serve", "--trust-request-chat-template", "--tokenize-timeout", "3"]
MODEL = "SmolLM2-135M-Instruct"
VALID_SHARE = 0.40
SLOW_TEMPLATE = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def processes(server_pid: int, engine_pid: int) -> dict[str, int]:
    """The server's processes by role: the API server, its engine core, its render workers and its constraint
    worker (replaced when a compile runs past the limit: the one alive now)."""
    out = {"api_server": server_pid, "engine": engine_pid}
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    cmdlines = {int(p): Path(f"/proc/{p}/cmdline").read_bytes() for p in children}
    workers = [pid for pid, cmd in cmdlines.items() if b"render_worker" in cmd]
    out.update({f"render_worker_{i}": pid for i, pid in enumerate(sorted(workers))})
    for pid, cmd in cmdlines.items():
        if b"constraint_worker" in cmd:
            out["constraint_worker"] = pid
    return out


def chat(text: str, **extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8, **extra}


def _history(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "Look it up."},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                  "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "found"}]


def requests_mix(n: int, seed: int = 0) -> list[tuple[str, str, dict | str]]:
    """``(kind, path, body)`` for ``n`` requests: kind is valid, malformed or costly; a str body is sent raw."""
    rng = random.Random(seed)
    valid = [lambda i: ("/v1/chat/completions", chat(f"Tell me about the number {i}.")),
             lambda i: ("/v1/completions", {"model": MODEL, "prompt": f"Count to {i % 10}:", "max_tokens": 8})]
    deep = "[" * 100_000 + "]" * 100_000
    malformed = [lambda i: ("/v1/chat/completions", '{"model": "x", "messages": [}'),
                 lambda i: ("/v1/chat/completions", chat("hi", temperature=-1)),
                 lambda i: ("/v1/chat/completions", chat("hi", no_such_field=1)),
                 lambda i: ("/v1/chat/completions", {**chat("hi"), "messages": _history("[" * 2000 + "]" * 2000)}),
                 lambda i: ("/tokenize", {"model": MODEL, "messages": _history("{" * 5000)}),
                 lambda i: ("/v1/chat/completions", f'{{"model": "{MODEL}", "messages": {deep}}}')]
    costly = [lambda i: ("/v1/completions", {"model": MODEL, "prompt": "Pick:", "max_tokens": 2,
                                             "structured_outputs": {"choice": ["x" * (1 << 20)]}}),
              lambda i: ("/v1/completions", {"model": MODEL, "prompt": "JSON:", "max_tokens": 2, "structured_outputs": {
                  "json": '{"type": "object", "properties": {"a": ' * 400 + "{}" + "}}" * 400}}),
              lambda i: ("/v1/completions", {"model": MODEL, "prompt": "a:", "max_tokens": 2,
                                             "structured_outputs": {"regex": "a{99999999999}"}}),
              lambda i: ("/v1/completions", {"model": MODEL, "prompt": "Say:", "max_tokens": 4, "structured_outputs": {
                  "regex": "|".join(f"s{i}w{j}x" for j in range(2000))}}),
              lambda i: ("/v1/chat/completions", chat("hi", chat_template=SLOW_TEMPLATE)),
              lambda i: ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2,
                                             "stop_token_ids": [2] * 300_000}),
              lambda i: ("/v1/completions", {"model": MODEL, "prompt": "word " * 600_000, "max_tokens": 2})]
    out = []
    for i in range(n):
        r = rng.random()
        kind, pool = (("valid", valid) if r < VALID_SHARE else ("malformed", malformed) if r < 0.75
                      else ("costly", costly))
        path, body = rng.choice(pool)(i)
        out.append((kind, path, body))
    return out


def send(c: httpx.Client, path: str, body: dict | str) -> int:
    if isinstance(body, str):
        return c.post(path, content=body, headers={"content-type": "application/json"}).status_code
    return c.post(path, json=body).status_code


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def run(args: argparse.Namespace) -> dict:
    port = _port()
    base = f"http://127.0.0.1:{port}"
    log = open(args.log, "w")  # noqa: SIM115 - open for the server's life
    proc = subprocess.Popen([*SERVE, "--port", str(port), *args.serve_args], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        c = httpx.Client(base_url=base, timeout=120)
        engine_pid = c.get("/version").json()["engine_pid"]
        # Warm: the server's grammar backend (the vocabulary's tables) and a request template are one-time costs.
        send(c, "/v1/completions", {"model": MODEL, "prompt": "{", "max_tokens": 2,
                                    "structured_outputs": {"json_object": True}})
        send(c, "/v1/chat/completions", chat("hi", chat_template="{{ messages[0].content }}"))
        quiet: list[float] = []
        # The quiet run sends the valid share of the soak alone, from as many clients as the soak has sending
        # valid requests at a time on average (40% of them), so the two latencies differ only by the hostile load.
        quiet_clients = max(1, round(args.concurrency * VALID_SHARE))

        def quiet_client(ids: range) -> None:
            with httpx.Client(base_url=base, timeout=120) as hc:
                for i in ids:
                    started = time.monotonic()
                    assert send(hc, "/v1/chat/completions", chat(f"Tell me about the number {i}.")) == 200
                    quiet.append(time.monotonic() - started)

        pool = [threading.Thread(target=quiet_client, args=(range(k, args.quiet, quiet_clients),))
                for k in range(quiet_clients)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        time.sleep(args.settle)
        procs = processes(proc.pid, engine_pid)
        before = {name: rss_mb(pid) for name, pid in procs.items()}
        peak = dict(before)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.5):
                for name, pid in processes(proc.pid, engine_pid).items():
                    peak[name] = max(peak.get(name, 0.0), rss_mb(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        work = requests_mix(args.requests, args.seed)
        statuses: Counter[str] = Counter()
        valid_s: list[float] = []
        lock = threading.Lock()

        def client(share: list[tuple[str, str, dict | str]]) -> None:
            with httpx.Client(base_url=base, timeout=120) as hc:
                for kind, path, body in share:
                    started = time.monotonic()
                    try:
                        status = str(send(hc, path, body))
                    except httpx.HTTPError as err:
                        status = type(err).__name__
                    with lock:
                        statuses[f"{kind} {status}"] += 1
                        if kind == "valid" and status == "200":
                            valid_s.append(time.monotonic() - started)

        soak_start = time.monotonic()
        threads = [threading.Thread(target=client, args=(work[i::args.concurrency],)) for i in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        soak_s = time.monotonic() - soak_start
        done.set()
        time.sleep(args.settle)
        after = {name: rss_mb(pid) for name, pid in processes(proc.pid, engine_pid).items()}
        restarts = c.get("/metrics").text.count("frame_engine_restarts_total 1")
        return {"requests": args.requests, "concurrency": args.concurrency, "soak_s": round(soak_s, 1),
                "statuses": dict(sorted(statuses.items())),
                "five_xx": sum(v for k, v in statuses.items() if k.split()[1].startswith("5")),
                "engine_deaths": int(c.get("/version").json()["engine_pid"] != engine_pid) + restarts,
                "quiet_p50_s": round(statistics.median(quiet), 3), "quiet_p99_s": round(percentile(quiet, 0.99), 3),
                "soak_p50_s": round(statistics.median(valid_s), 3), "soak_p99_s": round(percentile(valid_s, 0.99), 3),
                "rss_mb": {name: {"before": round(before.get(name, 0)), "peak": round(peak.get(name, 0)),
                                  "after": round(after.get(name, 0))} for name in sorted(set(before) | set(after))}}
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--quiet", type=int, default=60, help="valid requests of the quiet run")
    parser.add_argument("--settle", type=float, default=10.0, help="idle seconds before measuring memory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default="soak-serve.log", help="where the server's output goes")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("serve_args", nargs="*", help="more `frame serve` arguments (after --)")
    report = run(parser.parse_args())
    print(json.dumps(report, indent=2))
    if (out := parser.parse_args().json):
        Path(out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
