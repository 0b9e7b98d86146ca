"""schemathesis over the whole API of a real `frame serve`, for a set time: counts of statuses, 5xx and timeouts.

    .venv/bin/python benchmarks/fuzz_api.py [--minutes 10] [--timeout 60] [--url http://127.0.0.1:8000]

Without ``--url`` it starts ``frame serve`` (the bundled SmolLM2-135M-Instruct, with short generations: at most 2
tokens, ``n`` at most 2, a 64-token context) on a free port and stops it at the end. Then, round after round until
the time is up, it sends schemathesis's random cases of every operation in ``/openapi.json``, valid and invalid
(a fresh seed each round, so rounds differ), and checks each answer as tests/server/test_schema_fuzz.py does: no
5xx, a status, content type, headers and body the schema documents, invalid data refused. A case that gets no
answer within ``--timeout`` seconds counts as a timeout. It prints the counts and the first failures, and exits
with status 1 when any 5xx, timeout or failed check was seen. Not part of the test suite: it runs for minutes.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

SERVE_ARGS = ["--max-tokens-limit", "2", "--max-n", "2", "--max-logprobs", "2", "--max-model-len", "64",
              "--tokenize-timeout", "5", "--platform-opt", "threads=1", "--dtype", "float32"]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]
#: Random cases per operation and generation mode in one round (generation requests run the model: fewer).
PER_ROUND = {"POST /v1/completions": 10, "POST /v1/chat/completions": 8}
DEFAULT_PER_ROUND = 25


def start_server(log_path: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "frame.cli.main", "serve", "--port", str(port), *SERVE_ARGS],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"frame serve exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"frame serve did not become healthy; see {log_path}")


class Tally:
    """Statuses by operation, timeouts, and failed checks of every case sent."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url, timeout_s
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.timeouts: list[str] = []
        self.failures: list[str] = []

    def send(self, label: str, case) -> None:
        try:
            response = case.call(base_url=self.url, timeout=self.timeout_s)
        except requests.Timeout:
            self.timeouts.append(f"{label}: {case.body!r:.200}")
            return
        self.statuses[(label, response.status_code)] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (Exception, FailureGroup) as err:
            self.failures.append(f"{label} -> {response.status_code}: {str(err)[:300]}\n  body: {case.body!r:.200}")

    def round(self, operation, mode: GenerationMode, round_seed: int) -> None:
        @seed(round_seed)  # a fresh seed each round, so rounds differ
        @settings(max_examples=PER_ROUND.get(operation.label, DEFAULT_PER_ROUND), deadline=None, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case) -> None:
            self.send(operation.label, case)

        run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a case may wait for its answer")
    parser.add_argument("--url", help="fuzz this running server instead of starting one")
    args = parser.parse_args()
    proc = None
    if args.url is None:
        proc, url = start_server(os.path.join(tempfile.mkdtemp(prefix="frame-fuzz-"), "serve.log"))
    else:
        url = args.url.rstrip("/")
    try:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        tally, rounds = Tally(url, args.timeout), 0
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        pairs = [(operation, mode) for operation in operations for mode in GenerationMode]
        while time.monotonic() < end and pairs:
            round_seed = random.randrange(1 << 32)
            for pair in list(pairs):
                if time.monotonic() >= end:
                    break
                try:
                    tally.round(*pair, round_seed)
                except Unsatisfiable:  # no invalid request exists (GET /health takes nothing): nothing to send
                    pairs.remove(pair)
            rounds += 1
        seconds = time.monotonic() - t0
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    by_status = Counter()
    for (_, status), n in tally.statuses.items():
        by_status[status] += n
    errors = sum(n for status, n in by_status.items() if status >= 500)
    print(f"{sum(by_status.values())} answered requests in {seconds:.0f} s ({rounds} rounds over "
          f"{len(operations)} operations); statuses {sorted(by_status.items())}; 5xx: {errors}; timeouts: "
          f"{len(tally.timeouts)}; failed checks: {len(tally.failures)}")
    for line in (tally.timeouts + tally.failures)[:20]:
        print(line)
    return 1 if errors or tally.timeouts or tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
