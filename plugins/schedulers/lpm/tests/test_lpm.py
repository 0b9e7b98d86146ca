"""The lpm scheduler: frame's scheduler conformance suite over several caches, and its policy."""

from __future__ import annotations

import pydantic
import pytest
from frame.interfaces.scheduler import SchedulerLimits
from frame.sequence import Sequence
from frame.testing.doubles import PagedAllocatorDouble
from frame.testing.scheduler import (
    SchedulerConformance,
    SchedulerHarness,
    cache_factory_for,
    cache_params,
    make_prompt,
    plugin_installed,
    scheduler_plugin_factory,
)
from frame_scheduler_lpm import LpmOptions
from frame_scheduler_lpm.plugin import frame_scheduler_create

CACHES = cache_params("hashchain", "radix", "none")
REUSING_CACHES = [p for p in CACHES if p.values[0] in ("hashchain", "radix")]


class TestLpmConformance(SchedulerConformance):
    @pytest.fixture(params=CACHES)
    def cache_factory(self, request: pytest.FixtureRequest):
        return cache_factory_for(request.param)

    @pytest.fixture
    def scheduler_factory(self):
        return scheduler_plugin_factory("lpm")


def harness(cache_name: str = "double", sched: str = "lpm", *, num_blocks: int = 64, max_num_seqs: int = 4,
            **options: int) -> SchedulerHarness:
    cache = cache_factory_for(cache_name)(num_blocks, 4)
    limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_model_len=256)
    return SchedulerHarness(scheduler_plugin_factory(sched, **options)(limits), cache, limits)


def run_recording_admissions(h: SchedulerHarness) -> list[Sequence]:
    admissions: list[Sequence] = []
    while h.scheduler.has_unfinished():
        out = h.scheduler.schedule()
        admissions += [seq for seq, _ in h.scheduled(out) if seq.num_computed_tokens == seq.num_cached_tokens]
        h.finish_step(out, h.model.execute(out))
    return admissions


def test_options_are_validated():
    assert LpmOptions().max_waiting_for_lpm == 128
    with pytest.raises(pydantic.ValidationError):
        LpmOptions(max_waiting_for_lpm=-1)
    with pytest.raises(pydantic.ValidationError):
        LpmOptions(max_waiting=4)
    limits = SchedulerLimits(max_num_seqs=1, max_num_batched_tokens=8, max_model_len=16)
    with pytest.raises(TypeError, match="LpmOptions"):
        frame_scheduler_create(limits, SchedulerLimits.model_validate(limits))


def test_an_uncached_shared_prefix_defers_the_later_arrival():
    family = make_prompt(1, 40)
    orders = {}
    for tokens in (32, 0):
        h = harness(max_num_seqs=2, in_batch_prefix_tokens=tokens)
        a1, a2 = h.add([*family, 1], max_tokens=2), h.add([*family, 2], max_tokens=2)
        b1 = h.add(make_prompt(2, 41), max_tokens=2)
        names = {a1.seq_id: "a1", a2.seq_id: "a2", b1.seq_id: "b1"}
        orders[tokens] = [names[s.seq_id] for s in run_recording_admissions(h)]
    assert orders[32] == ["a1", "b1", "a2"]  # a2 waits for a1's prefix instead of computing it alongside
    assert orders[0] == ["a1", "a2", "b1"]


def test_a_long_queue_falls_back_to_queue_order_without_lookups():
    class CountingDouble(PagedAllocatorDouble):
        lookups = 0

        def match(self, seq):
            CountingDouble.lookups += 1
            return super().match(seq)

    limits = SchedulerLimits(max_num_seqs=1, max_num_batched_tokens=64, max_model_len=256)
    policy = scheduler_plugin_factory("lpm", max_waiting_for_lpm=2)(limits)
    h = SchedulerHarness(policy, CountingDouble(64, 4), limits)
    sched = h.scheduler
    seqs = [h.add(make_prompt(i, 40), max_tokens=1) for i in range(3)]
    assert list(policy.admission_order(sched.waiting, sched)) == seqs and CountingDouble.lookups == 0
    h.step()
    CountingDouble.lookups = 0  # admitting seqs[0] looked it up once
    assert list(policy.admission_order(sched.waiting, sched)) == seqs[1:] and CountingDouble.lookups == 2


@pytest.mark.parametrize("cache_name", REUSING_CACHES)
def test_admits_the_longest_cached_prefix_first(cache_name: str):
    h = harness(cache_name, max_num_seqs=1, in_batch_prefix_tokens=0)
    base = make_prompt(5, 48)
    h.add(base, max_tokens=1)
    h.run()  # base's KV is now cached
    unrelated = h.add(make_prompt(6, 48), max_tokens=1)
    short_hit = h.add([*base[:16], *make_prompt(7, 32)], max_tokens=1)
    long_hit = h.add([*base[:40], *make_prompt(8, 8)], max_tokens=1)
    assert run_recording_admissions(h) == [long_hit, short_hit, unrelated]
    assert long_hit.num_cached_tokens >= 36 and short_hit.num_cached_tokens >= 16 and unrelated.num_cached_tokens == 0


@pytest.mark.parametrize("cache_name", REUSING_CACHES)
def test_lpm_reuses_more_than_fcfs_on_interleaved_prefix_families(cache_name: str):
    # Two families of prompts share a 32-token prefix each and arrive interleaved (A B A B ...). The pool holds
    # one running sequence and about one family's prefix, so fcfs keeps evicting the prefix it needs next, while
    # lpm serves a family while its prefix is cached.
    families = [make_prompt(100, 32), make_prompt(200, 32)]
    prompts = [[*families[i % 2], *make_prompt(i, 4)] for i in range(12)]
    hits, outputs = {}, {}
    for sched in ("fcfs", "lpm"):
        h = harness(cache_name, sched, num_blocks=12, max_num_seqs=1)
        seqs = [h.add(p, max_tokens=4) for p in prompts]
        h.run()
        h.assert_no_leak()
        hits[sched] = h.cache.stats.hit_tokens
        outputs[sched] = [s.output_token_ids for s in seqs]
    assert outputs["lpm"] == outputs["fcfs"] == [h.model.reference(p, 4) for p in prompts]
    assert hits["lpm"] >= 10 * 32, hits  # every prompt but the first of each family reuses its whole prefix
    assert hits["lpm"] >= 2 * hits["fcfs"], hits


@pytest.mark.skipif(not plugin_installed("cache", "hashchain"), reason="cache plugin hashchain not installed")
def test_outputs_are_identical_across_schedulers():
    prompts = [make_prompt(i % 3, 10 + i) for i in range(10)]
    outputs = {}
    for sched in ("fcfs", "priority", "lpm"):
        h = harness("hashchain", sched, num_blocks=16, max_num_seqs=3)
        seqs = [h.add(p, max_tokens=12) for p in prompts]
        report = h.run()
        assert report.preemptions > 0
        h.assert_no_leak()
        outputs[sched] = [s.output_token_ids for s in seqs]
    assert outputs["fcfs"] == outputs["priority"] == outputs["lpm"]
