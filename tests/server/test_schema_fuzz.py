"""schemathesis against a real `frame serve`: about 1,900 requests built from /openapi.json, the boundary cases of
its coverage phase (each limit, one past it, each wrong type, each missing field, unexpected methods) and random
ones, valid and invalid. Valid ones must get a status, content type and body the schema documents; invalid ones a
4xx; no 5xx at all. The server's limits keep generation short (at most 2 tokens, n at most 2) and the schema carries
those limits, so valid requests reach the engine and are answered.

The same server runs with `--on-engine-death exit`; the module's last test kills its engine: the open stream ends
with the error event and `[DONE]`, and the server exits with status 1 for a supervisor outside to restart it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterable

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
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

FUZZ_ARGS = ["--max-tokens-limit", "2", "--max-n", "2", "--max-logprobs", "2", "--max-model-len", "64",
             "--tokenize-timeout", "5", "--on-engine-death", "exit"]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]
GENERATION = ("POST /v1/completions", "POST /v1/chat/completions")
#: (valid, invalid) random requests per operation, on top of about 1,200 coverage cases. Valid generation requests
#: run the model, so they are fewer. In all about 1,900 requests, about 40 s on an idle two-core machine (the
#: coverage phase's boundary cases are where the bugs were found; the random phase adds breadth).
EXAMPLES = {"POST /tokenize": (75, 100), "POST /detokenize": (75, 150), "POST /v1/completions": (20, 150),
            "POST /v1/chat/completions": (15, 100)}
#: Chat's valid boundary cases (about 200, each one a generation) are left to the random phase's few.
COVERAGE_MODES = {"POST /v1/chat/completions": [GenerationMode.NEGATIVE]}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, serve_tools):
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("fuzz"), *FUZZ_ARGS)
    yield server
    stop_serve(server)


class Recorder:
    """Sends cases, counts their statuses, and collects every failed check (so one run reports them all)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.failures: list[str] = []

    def send(self, label: str, case) -> None:
        response = case.call(base_url=self.base_url, timeout=60)
        self.statuses[(label, response.status_code)] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (Exception, FailureGroup) as err:
            self.failures.append(f"{label} -> {response.status_code}: {str(err)[:400]}\n  body: {case.body!r:.300}")

    def coverage(self, schema, operation) -> None:
        modes = COVERAGE_MODES.get(operation.label, list(GenerationMode))
        cases: Iterable = schema.iter_coverage_cases(operation, generation_modes=modes,
                                                     generation_config=schema.config.generation_for(operation=operation))
        for case in cases:
            self.send(operation.label, case)

    def fuzz(self, operation, mode: GenerationMode) -> None:
        valid, invalid = EXAMPLES.get(operation.label, (0, 0))

        @settings(max_examples=valid if mode is GenerationMode.POSITIVE else invalid, deadline=None, database=None,
                  derandomize=True, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case) -> None:
            self.send(operation.label, case)

        run()


def test_schemathesis_finds_no_5xx_and_no_schema_violation(fuzz_server, metrics):
    schema = schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json")
    steps_before = metrics(fuzz_server)["frame_engine_steps_total{rank=0}"]
    recorder = Recorder(fuzz_server.base_url)
    t0 = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        recorder.coverage(schema, operation)
        if operation.label in EXAMPLES:
            for mode in GenerationMode:
                recorder.fuzz(operation, mode)
    seconds, statuses = time.monotonic() - t0, recorder.statuses
    total = sum(statuses.values())
    assert not recorder.failures, f"{len(recorder.failures)} failure(s) in {total} requests:\n" + "\n".join(
        recorder.failures[:20])
    assert not [k for k in statuses if k[1] >= 500]
    assert total >= 1500, statuses  # the coverage cases and the random ones all ran
    generated = sum(n for (label, status), n in statuses.items() if label in GENERATION and status == 200)
    assert generated >= 50, statuses  # valid generation requests were answered by the engine
    assert metrics(fuzz_server)["frame_engine_steps_total{rank=0}"] > steps_before
    print(f"\n{total} requests in {seconds:.0f} s; {generated} generations answered; "
          f"statuses: {sorted(Counter(k[1] for k in statuses.elements()).items())}")


def test_engine_death_ends_the_server_with_status_1(fuzz_server):
    # 64 distinct prompts of 60 tokens, twice each: seconds of prefill, so the kill lands mid-stream.
    prompts = [[(i * 131 + j * 7) % 49000 + 1 for j in range(60)] for i in range(64)]
    body = {"prompt": prompts, "max_tokens": 2, "n": 2, "ignore_eos": True, "stream": True}
    events: list[str] = []
    first = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{fuzz_server.base_url}/v1/completions", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    first.set()

    thread = threading.Thread(target=stream)
    engine_pid = fuzz_server.engine_pid()
    thread.start()
    assert first.wait(60)
    os.kill(engine_pid, signal.SIGKILL)
    assert fuzz_server.proc.wait(60) == 1
    thread.join(30)
    assert not thread.is_alive()
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "engine_dead"
    assert "engine died; exiting (--on-engine-death exit)" in fuzz_server.log_text()
