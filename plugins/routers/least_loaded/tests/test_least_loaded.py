"""The least_loaded router: frame's router conformance suite, and how it compares loads."""

from __future__ import annotations

import pytest
from frame.interfaces.router import RankLoad, RouteRequest
from frame.testing.router import RouterConformance
from frame_router_least_loaded import LeastLoadedOptions, LeastLoadedRouter, plugin

REQUEST = RouteRequest("r", 10, 1)


class TestLeastLoadedConformance(RouterConformance):
    plugin_module = plugin
    plugin_name = "least_loaded"

    @pytest.fixture
    def make_router(self):
        return LeastLoadedRouter


def test_fewest_outstanding_tokens_win_then_requests() -> None:
    router = LeastLoadedRouter(3)
    loads = [RankLoad(0, 1, 900), RankLoad(1, 5, 300), RankLoad(2, 2, 300)]
    assert router.route(REQUEST, loads) == 2  # 300 tokens on both 1 and 2; 2 holds fewer requests


def test_by_requests_compares_requests_first() -> None:
    router = LeastLoadedRouter(3, LeastLoadedOptions(by="requests"))
    loads = [RankLoad(0, 1, 900), RankLoad(1, 5, 300), RankLoad(2, 2, 300)]
    assert router.route(REQUEST, loads) == 0


def test_ties_go_in_turn_so_idle_ranks_share_sequential_traffic() -> None:
    router = LeastLoadedRouter(3)
    idle = [RankLoad(r) for r in range(3)]
    assert [router.route(REQUEST, idle) for _ in range(4)] == [0, 1, 2, 0]
    assert router.route(REQUEST, [RankLoad(0), RankLoad(2)]) == 2  # rank 1 is down


def test_a_bad_option_is_refused() -> None:
    with pytest.raises(ValueError):
        LeastLoadedOptions(by="latency")
