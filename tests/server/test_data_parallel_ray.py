"""`frame serve --data-parallel-size 2 --distributed-backend ray` on a local Ray cluster (two CPUs, no
dashboard) that this test process starts and the server joins: each engine core is a Ray actor. 32 concurrent
requests through the openai client give one core's greedy outputs, and /metrics shows both ranks served; when
`ray.kill` takes one actor down (as a crash does, so Ray restarts it), that rank's open request fails with an
error naming it, the other rank keeps serving, and the restarted actor serves again."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray", reason="ray is the optional extra frame-engine[ray]")


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory, serve_tools):
    start_serve, stop_serve = serve_tools
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        server = start_serve(tmp_path_factory.mktemp("dp-ray"), "--data-parallel-size", "2",
                             "--distributed-backend", "ray", "--ray-address", address)
        yield server
        stop_serve(server)
    finally:
        ray.shutdown()


def _actor(rank: int):
    """The engine-core actor of ``rank`` (the server names them frame-engine-<token>-rank<r>-<n>)."""
    for _ in range(50):
        named = [a for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith("frame-engine-") and f"-rank{rank}-" in a["name"]]
        for entry in named:
            try:
                return ray.get_actor(entry["name"], namespace=entry["namespace"])
            except ValueError:  # an actor of an earlier generation, gone
                continue
        time.sleep(0.2)
    raise AssertionError(f"no engine-core actor of rank {rank} is registered")


def test_two_ray_actors_serve_32_concurrent_requests_as_one_core_does(ray_server, dp_reference, dp_tools) -> None:
    assert dp_tools.complete(ray_server, dp_tools.prompts) == dp_reference
    with ray_server.client() as c:
        assert c.get("/version").json()["engine_mode"] == "ray"
        values = dp_tools.metrics(c.get("/metrics").text)
    for rank in (0, 1):
        assert values[f"frame_router_requests_total{{rank={rank}}}"] == 16  # round_robin, the default router
        assert values[f"frame_engine_steps_total{{rank={rank}}}"] > 0
        assert values[f"frame_engine_generation_tokens_total{{rank={rank}}}"] > 0


def test_a_killed_actor_fails_its_requests_and_ray_restarts_it(ray_server, dp_tools) -> None:
    def kill(rank: int, pid: int) -> None:
        ray.kill(_actor(rank), no_restart=False)  # a crash: Ray restarts the actor, which builds a new core

    rank = dp_tools.kill_a_serving_rank(ray_server, kill)
    dp_tools.wait_rank_serves_again(ray_server, rank)
    with ray_server.client() as c:
        pids = {r["rank"]: r["pid"] for r in c.get("/version").json()["ranks"]}
    assert "the engine core actor of rank" in ray_server.log_text() and len(set(pids.values())) == 2
