"""The priority scheduler: frame's scheduler conformance suite over several caches, and its policy."""

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


class TestPriorityConformance(SchedulerConformance):
    @pytest.fixture(params=CACHES)
    def cache_factory(self, request: pytest.FixtureRequest):
        return cache_factory_for(request.param)

    @pytest.fixture
    def scheduler_factory(self):
        return scheduler_plugin_factory("priority")


def harness(num_blocks: int = 64, max_num_seqs: int = 4, budget: int = 64) -> SchedulerHarness:
    cache = PagedAllocatorDouble(num_blocks, 4)
    limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=256)
    return SchedulerHarness(scheduler_plugin_factory("priority")(limits), cache, limits)


def run_recording_admissions(h: SchedulerHarness) -> list[Sequence]:
    admissions: list[Sequence] = []
    while h.scheduler.has_unfinished():
        out = h.scheduler.schedule()
        admissions += [seq for seq, _ in h.scheduled(out) if seq.num_computed_tokens == 0]
        h.finish_step(out, h.model.execute(out))
    return admissions


def test_admits_by_priority_then_arrival():
    h = harness(max_num_seqs=1)
    priorities = [3, 0, 2, 0, -1, 3]
    seqs = [h.add(make_prompt(i, 5), max_tokens=2, priority=p) for i, p in enumerate(priorities)]
    assert run_recording_admissions(h) == [seqs[i] for i in (4, 1, 3, 2, 0, 5)]


def test_a_more_important_arrival_goes_before_older_waiting_ones():
    h = harness(max_num_seqs=1)
    first = h.add(make_prompt(1, 5), max_tokens=3, priority=1)
    h.step()
    old = h.add(make_prompt(2, 5), max_tokens=3, priority=1)
    urgent = h.add(make_prompt(3, 5), max_tokens=3, priority=0)
    assert run_recording_admissions(h) == [urgent, old]
    assert first.status is SequenceStatus.FINISHED_LENGTH
    h.assert_no_leak()


def test_the_least_important_running_sequence_is_the_victim():
    # Four 8-token prompts fill 8 of 9 blocks; as they decode, blocks run out. Victims go by (priority desc,
    # arrival desc): the priority-2 sequences first, the later of them before the earlier.
    h = harness(num_blocks=9, max_num_seqs=4)
    seqs = [h.add(make_prompt(i, 8), max_tokens=6, priority=p) for i, p in enumerate([2, 0, 2, 1])]
    victims: list[Sequence] = []
    while h.scheduler.has_unfinished():
        out = h.scheduler.schedule()
        victims += h.preempted(out)
        h.finish_step(out, h.model.execute(out))
    assert victims[:2] == [seqs[2], seqs[0]]
    assert seqs[1] not in victims
    assert all(s.num_output_tokens == 6 for s in seqs)
    h.assert_no_leak()


def test_a_victim_already_in_the_step_is_taken_out_and_its_budget_reused():
    h = harness(num_blocks=5, max_num_seqs=3, budget=6)
    a = h.add(make_prompt(1, 4), max_tokens=10, priority=5)
    h.step()  # a alone: its whole prompt, then it runs first in every later step
    b = h.add(make_prompt(2, 3), max_tokens=10, priority=0)
    c = h.add(make_prompt(3, 12), max_tokens=2, priority=0)
    h.step()
    h.step()  # now a, b and c hold all 5 blocks; b's next token needs a sixth
    assert h.scheduler.running == [a, b, c] and h.cache.num_free_blocks == 0
    out = h.scheduler.schedule()
    # a got its decode token first, then b ran dry and a (least important) was preempted: a leaves the step, and
    # the token it held goes to c's prefill chunk (5 tokens instead of 4).
    assert h.preempted(out) == [a] and a.status is SequenceStatus.PREEMPTED and a.num_computed_tokens == 0
    assert h.scheduled(out) == [(b, 1), (c, 5)]
    assert out.num_batched_tokens == 6
    h.finish_step(out, h.model.execute(out))
    h.run()
    for seq in (a, b, c):
        assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, seq.params.max_tokens)
    h.assert_no_leak()
