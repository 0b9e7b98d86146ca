"""schemathesis against a real `frame serve`: about 2,000 requests generated from /openapi.json, valid ones
(positive: they must get a status and a body the schema documents) and invalid ones (negative: they must be
refused with a 4xx). No 5xx at all. The server's limits keep generation short (at most 4 tokens, n at most 2), and
the schema carries those limits, so many valid requests reach the engine and are answered."""

from __future__ import annotations

import time
from collections import Counter

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

FUZZ_ARGS = ["--max-tokens-limit", "4", "--max-n", "2", "--max-logprobs", "2", "--max-model-len", "128",
             "--tokenize-timeout", "5"]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]
GENERATION = ("POST /v1/completions", "POST /v1/chat/completions")
#: (valid, invalid) requests per operation: valid generation requests run the model and invalid chat requests
#: are slow to generate, so they are fewer. In all about 2,000 requests: under a minute on an idle two-core
#: machine, about two when other test suites share it.
EXAMPLES = {"POST /tokenize": (250, 250), "POST /detokenize": (300, 500), "POST /v1/completions": (100, 350),
            "POST /v1/chat/completions": (40, 250)}


def examples(label: str, mode: GenerationMode) -> int:
    valid, invalid = EXAMPLES.get(label, (10, 0))
    return valid if mode is GenerationMode.POSITIVE else invalid


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, serve_tools):
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("fuzz"), *FUZZ_ARGS)
    yield server
    stop_serve(server)


def fuzz(operation, mode: GenerationMode, base_url: str, statuses: Counter, failures: list[str]) -> None:
    """Send generated requests to one operation, recording statuses and failed checks."""

    @settings(max_examples=examples(operation.label, mode), deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        response = case.call(base_url=base_url, timeout=60)
        statuses[(operation.label, mode.value, response.status_code)] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except (Exception, FailureGroup) as err:  # collect every failure, so one run reports them all
            failures.append(f"{operation.label} [{mode.value}] -> {response.status_code}: {str(err)[:400]}\n"
                            f"  body: {case.body!r:.300}")

    run()


def test_schemathesis_finds_no_5xx_and_no_schema_violation(fuzz_server, metrics):
    schema = schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json")
    steps_before = metrics(fuzz_server)["frame_engine_steps_total"]
    statuses: Counter[tuple[str, str, int]] = Counter()
    failures: list[str] = []
    t0 = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in GenerationMode:
            if examples(operation.label, mode):  # a GET here has nothing that could be made invalid
                fuzz(operation, mode, fuzz_server.base_url, statuses, failures)
    seconds = time.monotonic() - t0
    total = sum(statuses.values())
    assert not failures, f"{len(failures)} failure(s) in {total} requests:\n" + "\n".join(failures[:20])
    assert not [k for k in statuses if k[2] >= 500]
    assert total >= 2000, statuses
    generated = sum(n for (label, _, status), n in statuses.items() if label in GENERATION and status == 200)
    assert generated >= 30, statuses  # valid generation requests were answered by the engine
    assert metrics(fuzz_server)["frame_engine_steps_total"] > steps_before
    print(f"\n{total} requests in {seconds:.0f} s; {generated} generations answered; "
          f"statuses: {sorted(Counter(k[2] for k in statuses.elements()).items())}")
