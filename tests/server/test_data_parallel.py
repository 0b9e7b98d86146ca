"""`frame serve --data-parallel-size 2` over two child-process engine cores, with the prefix_affinity router:
32 concurrent requests through the openai client give one core's greedy outputs and /metrics shows both ranks
served; requests sharing a prefix land on one core; SIGKILL of one core's process fails only its requests, the
other core keeps serving, /health names the dead rank, and the supervisor brings it back."""

from __future__ import annotations

import os
import signal

import pytest


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory, serve_tools):
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("dp"), "--data-parallel-size", "2", "--router", "prefix_affinity")
    yield server
    stop_serve(server)


def test_two_cores_serve_32_concurrent_requests_as_one_does(dp_server, dp_reference, dp_tools) -> None:
    before = dp_tools.routed(dp_server)
    assert dp_tools.complete(dp_server, dp_tools.prompts) == dp_reference
    with dp_server.client() as c:
        values = dp_tools.metrics(c.get("/metrics").text)
        assert c.get("/health").json() == {"status": "ok", "ranks": [{"rank": 0, "status": "ok"},
                                                                     {"rank": 1, "status": "ok"}],
                                           "render_workers": {"size": 2, "missing": 0}}
        ranks = c.get("/version").json()["ranks"]
    after = dp_tools.routed(dp_server)
    assert sum(after.values()) - sum(before.values()) == 32
    for rank in (0, 1):
        assert after[rank] > before[rank], f"rank {rank} served none of the 32 requests: {after}"
        assert values[f"frame_engine_steps_total{{rank={rank}}}"] > 0
        assert values[f"frame_engine_generation_tokens_total{{rank={rank}}}"] > 0
        assert values[f"frame_engine_up{{rank={rank}}}"] == 1
    assert len({r["pid"] for r in ranks}) == 2 and dp_server.proc.pid not in {r["pid"] for r in ranks}


def test_requests_sharing_a_prefix_land_on_one_core(dp_server, dp_tools) -> None:
    system = ("You are a careful assistant for a library. Answer questions about opening hours, loans, late fees, "
              "reading rooms and the catalogue, politely and in one sentence. ")
    chosen = []
    with dp_server.client() as c:
        for topic in ("late fees", "opening hours", "the catalogue", "reading rooms", "loans", "printing"):
            before = dp_tools.routed(dp_server)
            resp = c.post("/v1/completions", json={"model": "SmolLM2-135M-Instruct", "max_tokens": 2,
                                                   "temperature": 0, "prompt": f"{system}Question: {topic}?"})
            assert resp.status_code == 200, resp.text
            after = dp_tools.routed(dp_server)
            chosen += [r for r in after if after[r] > before[r]]
            if len(chosen) > 1:
                assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32
    assert len(chosen) == 6 and len(set(chosen)) == 1, chosen


def test_a_killed_core_fails_its_requests_and_comes_back(dp_server, dp_tools) -> None:
    rank = dp_tools.kill_a_serving_rank(dp_server, lambda rank, pid: os.kill(pid, signal.SIGKILL))
    assert f"engine core rank {rank} died" in dp_server.log_text()
    dp_tools.wait_rank_serves_again(dp_server, rank)
    with dp_server.client() as c:
        assert 'frame_engine_restarts_total 1.0' in c.get("/metrics").text
