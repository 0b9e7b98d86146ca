"""The fcfs scheduler: frame's scheduler conformance suite over several caches, and its policy."""

from __future__ import annotations

import pytest
from frame.interfaces.scheduler import SchedulerLimits
from frame.sequence import Sequence, SequenceStatus
from frame.testing.doubles import PagedAllocatorDouble
from frame.testing.scheduler import (
    SchedulerConformance,
    SchedulerHarness,
    cache_factory_for,
    cache_params,
    make_prompt,
    scheduler_plugin_factory,
)

CACHES = cache_params("hashchain", "radix", "none")


class TestFcfsConformance(SchedulerConformance):
    @pytest.fixture(params=CACHES)
    def cache_factory(self, request: pytest.FixtureRequest):
        return cache_factory_for(request.param)

    @pytest.fixture
    def scheduler_factory(self):
        return scheduler_plugin_factory("fcfs")


def harness(num_blocks: int = 64, max_num_seqs: int = 4, budget: int = 64) -> SchedulerHarness:
    cache = PagedAllocatorDouble(num_blocks, 4)
    limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=256)
    return SchedulerHarness(scheduler_plugin_factory("fcfs")(limits), cache, limits)


def test_admits_in_arrival_order():
    h = harness(max_num_seqs=2)
    seqs = [h.add(make_prompt(i, 6), max_tokens=3) for i in range(5)]
    admitted: list[Sequence] = []
    while h.scheduler.has_unfinished():
        out = h.scheduler.schedule()
        admitted += [seq for seq, _ in h.scheduled(out) if seq.num_computed_tokens == 0]
        h.finish_step(out, h.model.execute(out))
    assert admitted == seqs


def test_preempts_the_newest_and_lets_nobody_jump_the_queue():
    # Three 8-token prompts take 6 of 7 blocks. Decoding, c (newest) is preempted first; later b preempts itself.
    h = harness(num_blocks=7, max_num_seqs=3)
    a, b, c = (h.add(make_prompt(i, 8), max_tokens=8) for i in range(3))
    d = h.add(make_prompt(9, 4), max_tokens=2)  # needs one block, but arrives after the others
    preempted: list[Sequence] = []
    admissions: list[Sequence] = []
    while h.scheduler.has_unfinished():
        out = h.scheduler.schedule()
        preempted += h.preempted(out)
        admissions += [seq for seq, _ in h.scheduled(out) if seq.num_computed_tokens == 0]
        h.finish_step(out, h.model.execute(out))
    assert preempted == [c, b]
    # First admissions in arrival order except d, which waits behind the preempted c although a block is free;
    # the most recently preempted goes back in front of the queue.
    assert admissions == [a, b, c, b, c, d]
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in (a, b, c, d))
    h.assert_no_leak()


def test_a_full_pool_preempts_the_newest_before_it_runs():
    # Both 8-token prompts fill the 4 blocks; a's first decode needs a fifth, so b (newest) is preempted and its
    # blocks go to a; b is not in the step at all and comes back once a finished.
    h = harness(num_blocks=4, max_num_seqs=2)
    a = h.add(make_prompt(1, 8), max_tokens=6)
    b = h.add(make_prompt(2, 8), max_tokens=6)
    h.step()  # both prefilled: 4 of 4 blocks used, first output tokens sampled
    out = h.scheduler.schedule()
    assert [seq for seq, _ in h.scheduled(out)] == [a] and h.preempted(out) == [b]
    assert out.num_batched_tokens == 1 and b.status is SequenceStatus.PREEMPTED
    h.finish_step(out, h.model.execute(out))
    h.run()
    assert a.num_output_tokens == b.num_output_tokens == 6
    h.assert_no_leak()


def test_rejects_a_sequence_queued_twice_or_finished():
    h = harness()
    seq = h.add(make_prompt(1, 5), max_tokens=1)
    with pytest.raises(ValueError, match="already queued"):
        h.scheduler.add(seq)
    h.run()
    with pytest.raises(ValueError, match="already finished"):
        h.scheduler.add(seq)
