"""Continuous decode steps (``num_continuous_decode_steps``, SGLang's flag): the scheduler's side, over the fcfs
policy and each cache plugin, on the simulated model (which checks every KV slot a step reads and writes)."""

from __future__ import annotations

import pytest
from frame.interfaces.scheduler import SchedulerLimits
from frame.testing.scheduler import (
    SchedulerHarness,
    cache_factory_for,
    cache_params,
    expected_output,
    make_prompt,
    scheduler_plugin_factory,
)

CACHES = cache_params("hashchain", "radix", "none")


def harness(cache_name: str, steps: int = 4, blocks: int = 64) -> SchedulerHarness:
    cache = cache_factory_for(cache_name)(blocks, 4)
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
                             num_continuous_decode_steps=steps)
    return SchedulerHarness(scheduler_plugin_factory("fcfs")(limits), cache, limits)


def run(h: SchedulerHarness) -> list[int]:
    """Step to the end; returns each step's decode_steps."""
    steps = []
    while h.scheduler.has_unfinished():
        plan = h.scheduler.schedule()
        h._check_schedule(plan)
        steps.append(plan.decode_steps)
        h.finish_step(plan, h.model.execute(plan))
    return steps


@pytest.mark.parametrize("cache_name", CACHES)
def test_a_lone_decode_runs_several_steps_at_once_and_gives_the_same_tokens(cache_name: str) -> None:
    h = harness(cache_name)
    seq = h.add(make_prompt(1, 10), max_tokens=11)
    steps = run(h)
    assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, 11)
    # The prefill samples the first token; then 4 + 4 + 2 (the last two all that max_tokens leaves).
    assert steps == [1, 4, 4, 2]
    h.assert_no_leak()


@pytest.mark.parametrize("cache_name", CACHES)
def test_a_stop_inside_the_steps_cuts_the_tokens_after_it_and_frees_the_blocks(cache_name: str) -> None:
    h = harness(cache_name, steps=8)
    prompt = make_prompt(2, 9)
    reference = h.model.reference(prompt, 30)
    stop = reference[5]  # sampled by the second run of steps, with more of them after it
    seq = h.add(prompt, max_tokens=30, ignore_eos=False, eos=[stop])
    run(h)
    assert seq.output_token_ids == expected_output(reference, [stop])
    assert seq.num_computed_tokens <= seq.num_tokens
    h.assert_no_leak()


@pytest.mark.parametrize("cache_name", CACHES)
def test_nothing_waits_behind_them_and_a_batch_of_decodes_runs_them_too(cache_name: str) -> None:
    h = harness(cache_name)
    first = h.add(make_prompt(3, 12), max_tokens=9)
    h.step()  # its prefill
    second = h.add(make_prompt(4, 7), max_tokens=9)
    plan = h.scheduler.schedule()
    assert plan.decode_steps == 1  # the second is admitted beside the first's single decode step
    h.finish_step(plan, h.model.execute(plan))
    plan = h.scheduler.schedule()
    assert plan.decode_steps == 4 and len(plan.running) == 2  # two decodes, nothing waiting
    h.finish_step(plan, h.model.execute(plan))
    h.add(make_prompt(5, 5), max_tokens=2)
    plan = h.scheduler.schedule()
    assert plan.decode_steps == 1  # admitted: a prefill is in the step
    h.finish_step(plan, h.model.execute(plan))
    h.run()
    for seq in (first, second):
        assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, 9)
    h.assert_no_leak()


def test_a_pool_without_room_for_them_runs_one_step_and_preempts_nobody() -> None:
    # 4 blocks of 4 tokens: a 10-token prompt has room for 6 more, not for the 8 the steps would take.
    h = harness("hashchain", steps=8, blocks=4)
    prompt = make_prompt(6, 10)
    reference = h.model.reference(prompt, 30)
    seq = h.add(prompt, max_tokens=30, ignore_eos=False, eos=[reference[3]])
    steps = run(h)
    assert seq.output_token_ids == expected_output(reference, [reference[3]])
    assert set(steps) == {1} and h.report.preemptions == 0
    h.assert_no_leak()


def test_the_tokens_of_continuous_steps_are_not_counted_as_accepted_drafts() -> None:
    h = harness("hashchain")
    h.add(make_prompt(7, 10), max_tokens=9)
    h.step()
    plan = h.scheduler.schedule()
    outcome = h.scheduler.update(plan, h.model.execute(plan))
    assert plan.decode_steps == 4 and next(iter(outcome.appended.values())) == 4
    assert outcome.num_draft_tokens == 0 and outcome.num_accepted_tokens == 0
