"""The engine scheduler's in-batch prefix wait, over the fcfs policy and each cache plugin."""

from __future__ import annotations

import pytest
from frame.engine.core.chunking import common_prefix_length
from frame.interfaces.scheduler import SchedulerLimits
from frame.testing.scheduler import (
    SchedulerHarness,
    cache_factory_for,
    cache_params,
    make_prompt,
    scheduler_plugin_factory,
)

CACHES = cache_params("hashchain", "radix", "none")
REUSING = {"hashchain", "radix"}


def harness(cache_name: str, *, budget: int = 64) -> SchedulerHarness:
    cache = cache_factory_for(cache_name)(128, 4)
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=256)
    return SchedulerHarness(scheduler_plugin_factory("fcfs")(limits), cache, limits)


def run_counting_prefill(h: SchedulerHarness) -> tuple[int, list[list[str]]]:
    """Step to the end; returns the prompt tokens computed and each step's newly admitted sequence ids."""
    computed, admitted = 0, []
    while h.scheduler.has_unfinished():
        out = h.scheduler.schedule()
        h._check_schedule(out)
        admitted.append([seq.seq_id for seq, _ in h.scheduled(out) if seq.num_computed_tokens == seq.num_cached_tokens])
        computed += out.num_prompt_tokens
        h.finish_step(out, h.model.execute(out))
    return computed, admitted


@pytest.mark.parametrize("cache_name", CACHES)
def test_requests_behind_one_long_prefix_wait_for_it_instead_of_computing_it_again(cache_name: str):
    system = make_prompt(1, 40)
    h = harness(cache_name)
    family = [h.add([*system, *make_prompt(10 + i, 6)], max_tokens=3) for i in range(4)]
    unrelated = h.add(make_prompt(2, 12), max_tokens=3)
    computed, admitted = run_counting_prefill(h)
    for seq in (*family, unrelated):
        assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, 3)
    h.assert_no_leak()
    if cache_name in REUSING:
        # Step one: the first of the family and the unrelated prompt; the rest reuse the 40 tokens afterwards.
        assert admitted[0] == [family[0].seq_id, unrelated.seq_id]
        assert computed == 46 + 12 + 3 * 6
    else:  # nothing to reuse, so nobody waits: the budget fills in arrival order
        assert admitted[0] == [family[0].seq_id, family[1].seq_id]
        assert computed == 4 * 46 + 12


@pytest.mark.parametrize("cache_name", [p for p in CACHES if p.values[0] in REUSING])
def test_a_short_shared_prefix_does_not_hold_a_request_back(cache_name: str):
    # A 16-token chat template in front of 40-token questions: waiting would save less than half the prompt.
    template = make_prompt(3, 16)
    h = harness(cache_name, budget=256)
    seqs = [h.add([*template, *make_prompt(20 + i, 40)], max_tokens=2) for i in range(3)]
    _, admitted = run_counting_prefill(h)
    assert admitted[0] == [s.seq_id for s in seqs]


def test_common_prefix_length():
    a = list(range(100))
    assert common_prefix_length(a, a, 100) == 100
    assert common_prefix_length(a, a, 37) == 37
    for split in (0, 1, 15, 16, 63, 99):
        b = [*a[:split], -1, *a[split + 1:]]
        assert common_prefix_length(a, b, 100) == split
    assert common_prefix_length(a, a[:10], 100) == 10
