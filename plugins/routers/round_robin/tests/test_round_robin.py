"""The round_robin router: frame's router conformance suite, and its turn order."""

from __future__ import annotations

import pytest
from frame.interfaces.router import RankLoad, RouteRequest
from frame.testing.router import RouterConformance
from frame_router_round_robin import RoundRobinRouter, plugin


class TestRoundRobinConformance(RouterConformance):
    plugin_module = plugin
    plugin_name = "round_robin"

    @pytest.fixture
    def make_router(self):
        return RoundRobinRouter


def _route(router: RoundRobinRouter, live: list[int], heavy: int | None = None) -> int:
    loads = [RankLoad(r, num_requests=100 if r == heavy else 0) for r in live]
    return router.route(RouteRequest("r", 10, 1), loads)


def test_turns_go_round_and_skip_a_dead_rank_until_it_is_back() -> None:
    router = RoundRobinRouter(3)
    assert [_route(router, [0, 1, 2]) for _ in range(4)] == [0, 1, 2, 0]
    assert [_route(router, [0, 2]) for _ in range(3)] == [2, 0, 2]  # rank 1 is down
    assert [_route(router, [0, 1, 2]) for _ in range(3)] == [0, 1, 2]


def test_ignores_load() -> None:
    router = RoundRobinRouter(2)
    assert [_route(router, [0, 1], heavy=0) for _ in range(4)] == [0, 1, 0, 1]
