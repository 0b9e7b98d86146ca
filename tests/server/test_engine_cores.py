"""The engine process of `frame serve` leaves cores to the API server (as vLLM's CPU backend does)."""

from __future__ import annotations

import os

import pytest
from frame.engine.client.mp import cores_for_engine


@pytest.mark.parametrize(("host", "reserved", "expected"), [
    ({0, 1, 2, 3, 4}, None, [0, 1, 2, 3]),   # default: one core for the server where the engine keeps four
    ({0, 1, 2, 3}, None, None),               # fewer: a reserved core would cost the engine more than it saves
    ({0, 1, 2, 3}, 2, [0, 1]),
    ({0, 1, 2, 3}, 0, None),                  # 0: the engine keeps every core
    ({0, 1, 2, 3}, 9, [0]),                   # never fewer than one core
    ({5}, None, None),                        # one core: nothing to leave
    ({2, 7}, None, None),
    ({2, 7}, 1, [2]),
])
def test_cores_for_engine(monkeypatch, host: set[int], reserved: int | None, expected: list[int] | None) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(host))
    assert cores_for_engine(reserved) == expected


@pytest.mark.parametrize(("host", "reserved", "engines", "expected"), [
    ({0, 1}, None, 2, None),                          # two data-parallel cores on two: no core to spare
    (set(range(9)), None, 2, list(range(8))),         # four cores each remain: the server gets the ninth
    (set(range(8)), None, 2, None),
    ({0, 1, 2, 3}, None, 8, None),
    ({0, 1}, 1, 2, [0]),                              # asked for: the server gets its core anyway
])
def test_a_core_is_left_to_the_server_only_when_every_engine_keeps_four(
        monkeypatch, host: set[int], reserved: int | None, engines: int, expected: list[int] | None) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(host))
    assert cores_for_engine(reserved, engines) == expected


def test_served_engine_process_runs_on_the_engine_cores(tmp_path_factory, serve_tools) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one usable core: the engine keeps it")
    start_serve, stop_serve = serve_tools
    server = start_serve(tmp_path_factory.mktemp("cores"), "--reserved-cores", "1")
    try:
        assert os.sched_getaffinity(server.engine_pid()) == set(cores_for_engine(1))
        assert len(os.sched_getaffinity(server.engine_pid())) == len(os.sched_getaffinity(0)) - 1
    finally:
        stop_serve(server)
