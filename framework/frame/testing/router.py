"""Conformance suite for data-parallel router plugins: subclass :class:`RouterConformance`.

A router may place requests however it likes, so the suite checks the contract rather than a policy: every
answer is one of the live ranks it was given, whatever their loads and whichever ranks are missing (dead); one
live rank always gets everything; unrelated requests under equal loads are spread over the live ranks instead
of being pinned to one; a rank reset (its core died or restarted) is accepted for every rank, at any time, and
routing carries on. A subclass provides ``make_router`` (``num_ranks -> Router``)::

    class TestMyRouter(RouterConformance):
        plugin_module = plugin     # also creates the router through its hooks
        plugin_name = "mine"

        @pytest.fixture
        def make_router(self):
            return MyRouter
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from types import ModuleType

import pytest

from frame.interfaces.router import RankLoad, Router, RouteRequest, block_digests

RouterFactory = Callable[[int], Router]
BLOCK_SIZE = 16


def route_request(request_id: str, prompt: Sequence[int], max_new_tokens: int = 16, *, digests: bool = True,
                  salt: str | None = None) -> RouteRequest:
    """A RouteRequest for ``prompt``, with its block digests (as the core computes them) unless ``digests`` is
    False (what a router that does not set ``uses_prefix_digests`` receives)."""
    return RouteRequest(request_id, len(prompt), max_new_tokens,
                        block_digests(prompt, BLOCK_SIZE, salt) if digests else ())


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(1, 50_000) for _ in range(length)]


class RouterConformance:
    """The contract of :class:`~frame.interfaces.router.Router`, run against ``make_router``."""

    #: The plugin's module and name; when set, the suite also creates the router through its hooks.
    plugin_module: ModuleType | None = None
    plugin_name: str = ""

    @pytest.fixture
    def make_router(self) -> RouterFactory:
        pytest.fail(f"{type(self).__name__} must define a make_router fixture: num_ranks -> Router")

    def request(self, router: Router, request_id: str, prompt: Sequence[int], max_new_tokens: int = 16) -> RouteRequest:
        return route_request(request_id, prompt, max_new_tokens, digests=router.uses_prefix_digests)

    def test_answers_one_of_the_live_ranks_whatever_the_loads(self, make_router: RouterFactory) -> None:
        rng = random.Random(0)
        router = make_router(4)
        shared = random_prompt(rng, 48)
        for i in range(300):
            live = sorted(rng.sample(range(4), rng.randint(1, 4)))
            loads = [RankLoad(r, rng.randint(0, 40), rng.randint(0, 20_000)) for r in live]
            prompt = (shared if i % 3 == 0 else []) + random_prompt(rng, rng.randint(1, 70))
            rank = router.route(self.request(router, f"r{i}", prompt, rng.randint(1, 64)), loads)
            assert rank in live, f"request r{i} went to rank {rank}, but only {live} are live"

    def test_one_live_rank_gets_everything(self, make_router: RouterFactory) -> None:
        rng = random.Random(1)
        router = make_router(3)
        for i in range(30):
            load = [RankLoad(2, num_requests=i, num_tokens=100 * i)]
            assert router.route(self.request(router, f"r{i}", random_prompt(rng, 40)), load) == 2

    def test_unrelated_requests_under_equal_loads_are_spread(self, make_router: RouterFactory) -> None:
        rng = random.Random(2)
        router = make_router(3)
        loads = [RankLoad(r, 2, 500) for r in range(3)]
        chosen = Counter(router.route(self.request(router, f"r{i}", random_prompt(rng, 64)), loads)
                         for i in range(30))
        assert set(chosen) == {0, 1, 2}, f"30 unrelated requests under equal loads all went to {dict(chosen)}"

    def test_prompts_shorter_than_a_block_and_empty_digests_route(self, make_router: RouterFactory) -> None:
        router = make_router(2)
        loads = [RankLoad(0), RankLoad(1)]
        assert router.route(RouteRequest("short", 3, 1, block_digests([1, 2, 3], BLOCK_SIZE)), loads) in (0, 1)
        assert router.route(RouteRequest("none", 100, 1), loads) in (0, 1)

    def test_rank_resets_are_accepted_and_routing_carries_on(self, make_router: RouterFactory) -> None:
        rng = random.Random(3)
        router = make_router(3)
        prompt = random_prompt(rng, 64)
        loads = [RankLoad(r) for r in range(3)]
        first = router.route(self.request(router, "a", prompt), loads)
        for rank in range(3):
            router.rank_reset(rank)
        router.rank_reset(first)  # twice in a row, too
        survivors = [load for load in loads if load.rank != first]
        assert router.route(self.request(router, "b", prompt), survivors) in {s.rank for s in survivors}
        assert router.route(self.request(router, "c", prompt), loads) in range(3)

    def test_refuses_no_ranks_at_construction(self, make_router: RouterFactory) -> None:
        with pytest.raises(ValueError):
            make_router(0)

    def test_created_through_the_plugin_hooks(self) -> None:
        if self.plugin_module is None:
            pytest.skip("set plugin_module and plugin_name to check registration and the create hook")
        from frame.testing.registration import plugin_hooks

        with plugin_hooks("router", self.plugin_name, self.plugin_module) as (hooks, options):
            router = hooks.create_router(self.plugin_name, 2, BLOCK_SIZE, options)
            assert isinstance(router, Router) and router.num_ranks == 2
            assert router.route(self.request(router, "x", list(range(40))), [RankLoad(1)]) == 1
