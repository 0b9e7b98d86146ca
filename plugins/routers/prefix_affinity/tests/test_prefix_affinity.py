"""The prefix_affinity router: frame's router conformance suite, affinity, the load bound and its memory."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from frame.interfaces.router import RankLoad
from frame.testing.router import RouterConformance, random_prompt, route_request
from frame_router_prefix_affinity import PrefixAffinityOptions, PrefixAffinityRouter, plugin

IDLE = [RankLoad(0), RankLoad(1)]


class TestPrefixAffinityConformance(RouterConformance):
    plugin_module = plugin
    plugin_name = "prefix_affinity"

    @pytest.fixture
    def make_router(self):
        return PrefixAffinityRouter


def test_requests_sharing_a_prefix_follow_it_and_new_prefixes_go_where_there_is_room() -> None:
    rng = random.Random(0)
    router = PrefixAffinityRouter(2)
    system_a, system_b = random_prompt(rng, 96), random_prompt(rng, 96)  # 6 blocks each
    first_a = router.route(route_request("a0", system_a + random_prompt(rng, 20)), IDLE)
    first_b = router.route(route_request("b0", system_b + random_prompt(rng, 20)), IDLE)
    assert first_a != first_b  # the second prefix goes to the core that remembers nothing yet
    for i in range(1, 8):
        assert router.route(route_request(f"a{i}", system_a + random_prompt(rng, 20)), IDLE) == first_a
        assert router.route(route_request(f"b{i}", system_b + random_prompt(rng, 20)), IDLE) == first_b


def test_a_conversation_stays_on_its_core_turn_after_turn() -> None:
    rng = random.Random(1)
    router = PrefixAffinityRouter(3)
    loads = [RankLoad(r) for r in range(3)]
    conversations = [random_prompt(rng, 40) for _ in range(3)]
    homes = [router.route(route_request(f"c{i}", c), loads) for i, c in enumerate(conversations)]
    assert sorted(homes) == [0, 1, 2]
    for turn in range(4):
        for i, conversation in enumerate(conversations):
            conversation += random_prompt(rng, rng.randint(10, 40))
            assert router.route(route_request(f"c{i}t{turn}", conversation), loads) == homes[i]


def test_a_hot_prefix_fills_its_core_only_up_to_the_load_bound() -> None:
    rng = random.Random(2)
    router = PrefixAffinityRouter(2, PrefixAffinityOptions(balance_abs=4, balance_rel=1.5))
    hot = random_prompt(rng, 128)
    held = [0, 0]
    for i in range(32):  # all in flight at once: each core's load is what was sent to it
        rank = router.route(route_request(f"h{i}", hot + random_prompt(rng, 8)),
                            [RankLoad(r, held[r], 100 * held[r]) for r in range(2)])
        held[rank] += 1
        assert max(held) - min(held) <= 5 or max(held) <= 1.5 * min(held)
    assert min(held) >= 12, held  # the overflow went to the other core instead of queueing behind one
    assert router.matched_blocks(route_request("x", hot).block_digests, 1 - rank) == 8  # both now hold it


def test_without_load_a_shared_prefix_goes_to_one_core() -> None:
    rng = random.Random(3)
    router = PrefixAffinityRouter(4)
    prefix = random_prompt(rng, 64)
    chosen = Counter(router.route(route_request(f"p{i}", prefix + random_prompt(rng, 16)),
                                  [RankLoad(r) for r in range(4)]) for i in range(20))
    assert len(chosen) == 1


def test_a_short_shared_start_below_the_threshold_does_not_pin_requests() -> None:
    rng = random.Random(4)
    router = PrefixAffinityRouter(2, PrefixAffinityOptions(match_threshold=0.5))
    header = random_prompt(rng, 16)  # one shared block of eight
    chosen = Counter(router.route(route_request(f"q{i}", header + random_prompt(rng, 112)), IDLE)
                     for i in range(10))
    assert chosen[0] == chosen[1] == 5


def test_a_reset_core_is_forgotten_and_tenants_do_not_share() -> None:
    rng = random.Random(5)
    router = PrefixAffinityRouter(2)
    prompt = random_prompt(rng, 64)
    rank = router.route(route_request("a", prompt), IDLE)
    assert router.matched_blocks(route_request("a", prompt).block_digests, rank) == 4
    assert router.matched_blocks(route_request("a", prompt, salt="tenant").block_digests, rank) == 0
    router.rank_reset(rank)
    assert router.remembered(rank) == 0 and router.matched_blocks(route_request("a", prompt).block_digests, rank) == 0


def test_memory_is_bounded_and_forgets_a_chain_from_its_tail() -> None:
    rng = random.Random(6)
    router = PrefixAffinityRouter(1, PrefixAffinityOptions(max_blocks_per_rank=6))
    old, new = random_prompt(rng, 64), random_prompt(rng, 48)  # 4 blocks, then 3
    router.route(route_request("old", old), [RankLoad(0)])
    router.route(route_request("new", new), [RankLoad(0)])
    assert router.remembered(0) == 6
    assert router.matched_blocks(route_request("old", old).block_digests, 0) == 3  # its last block went first
    assert router.matched_blocks(route_request("new", new).block_digests, 0) == 3
