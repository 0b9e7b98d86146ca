"""Long prefills share the step (issue 31): while a long prompt is prefilled in chunks, short requests that arrive
later are admitted and decode beside it; the cap is the scheduling policy's, which a plugin may change.

The first tests run the engine's scheduler over each in-tree policy with the simulated model (no tensors); the last
runs the real engine on the bundled model.
"""

from __future__ import annotations

import pytest
from frame.engine.wire.requests import EngineRequest
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy, StepLoad
from frame.sampling_params import SamplingParams
from frame.sequence import Sequence
from frame.testing.scheduler import SchedulerHarness, cache_factory_for, make_prompt, scheduler_plugin_factory

POLICIES = ["fcfs", "lpm", "priority"]


def harness(policy: str | SchedulingPolicy = "fcfs", *, threshold: int = 8, max_long: int | None = 1,
            budget: int = 32) -> SchedulerHarness:
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=512,
                             long_prefill_token_threshold=threshold, max_long_partial_prefills=max_long)
    made = scheduler_plugin_factory(policy)(limits) if isinstance(policy, str) else policy
    return SchedulerHarness(made, cache_factory_for("hashchain")(256, 4), limits)


def first_token_steps(h: SchedulerHarness, arrivals: dict[int, list[int]], max_tokens: int = 3) -> dict[str, int]:
    """Run to the end, adding ``arrivals[step]`` prompts before that step; the step of each request's first token,
    with every output checked against the simulated model's."""
    first: dict[str, int] = {}
    seqs: list[Sequence] = []
    step = 0
    while h.scheduler.has_unfinished() or arrivals:
        seqs += [h.add(prompt, max_tokens=max_tokens) for prompt in arrivals.pop(step, [])]
        h.step()
        step += 1
        first.update({s.seq_id: step for s in seqs if s.num_output_tokens and s.seq_id not in first})
    for seq in seqs:
        assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, max_tokens)
    h.assert_no_leak()
    return first


@pytest.mark.parametrize("policy", POLICIES)
def test_a_short_request_sent_during_a_long_prefill_gets_its_first_token_before_it(policy: str) -> None:
    long_prompt = make_prompt(1, 200)
    first = first_token_steps(harness(policy), {0: [long_prompt], 1: [make_prompt(2, 6)], 3: [make_prompt(3, 5)]})
    # Step 1 the long prompt is alone and takes the whole budget (32); in steps 2-6, beside the short ones, 8 tokens
    # a step, each short one admitted the step it arrives, its first token sampled there; alone again, it takes
    # 32 a step and ends its prefill in step 10 (32 + 5 * 8 + 4 * 32 = 200).
    assert first["seq-2"] == 2 and first["seq-3"] == 4
    assert first["seq-1"] == 10


def test_without_the_cap_the_short_request_waits_for_the_whole_prefill() -> None:
    first = first_token_steps(harness(threshold=0), {0: [make_prompt(1, 200)], 1: [make_prompt(2, 6)]})
    assert first["seq-1"] == (200 + 31) // 32 and first["seq-2"] >= first["seq-1"]


def test_a_long_prompt_alone_takes_the_whole_budget() -> None:
    h = harness()
    h.add(make_prompt(1, 100), max_tokens=2)
    plan = h.scheduler.schedule()
    assert [n for _, n in h.scheduled(plan)] == [32]
    h.finish_step(plan, h.model.execute(plan))


def test_shorter_prompts_pass_a_long_one_waiting_for_its_turn() -> None:
    """max_long_partial_prefills 1: a second long prompt waits until the first is prefilled; short ones behind it
    are admitted meanwhile."""
    h = harness()
    prompts = (make_prompt(1, 60), make_prompt(2, 60), make_prompt(3, 5))
    long_a, long_b, short = (h.add(p, max_tokens=2) for p in prompts)
    plan = h.scheduler.schedule()
    assert [(s.seq_id, n) for s, n in h.scheduled(plan)] == [(long_a.seq_id, 8), (short.seq_id, 5)]
    h.finish_step(plan, h.model.execute(plan))
    h.run()
    h.assert_no_leak()
    assert long_b.output_token_ids == h.model.reference(long_b.prompt_token_ids, 2)
    two = harness(max_long=2)
    for p in prompts:
        two.add(p, max_tokens=2)
    assert [n for _, n in two.scheduled(two.scheduler.schedule())] == [8, 8, 5]


def test_requests_behind_a_capped_shared_prefix_wait_for_it_instead_of_computing_it() -> None:
    """Four prompts behind one 40-token system prompt, its prefill held to 8 tokens a step: the other three wait
    for the whole prefix, over several steps, and compute only their own 6 tokens."""
    h = harness(max_long=None)  # the default: nothing but the shared prefix holds the three back
    system = make_prompt(1, 40)
    family = [h.add([*system, *make_prompt(10 + i, 6)], max_tokens=3) for i in range(4)]
    computed = 0
    while h.scheduler.has_unfinished():
        plan = h.scheduler.schedule()
        computed += plan.num_prompt_tokens
        h.finish_step(plan, h.model.execute(plan))
    assert computed == 46 + 3 * 6
    for seq in family:
        assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, 3)
    h.assert_no_leak()


class _Uncapped(SchedulingPolicy):
    """A plugin's policy that lets every prefill take the whole budget (the engine must follow it)."""

    def admission_order(self, waiting, prefix):
        return waiting

    def preemption_victim(self, running):
        return running[-1]

    def prefill_limit(self, seq: Sequence, remaining: int, load: StepLoad) -> int:
        return remaining


def test_the_cap_is_the_policy_s_choice() -> None:
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=512,
                             long_prefill_token_threshold=8)
    first = first_token_steps(harness(_Uncapped(limits)), {0: [make_prompt(1, 200)], 1: [make_prompt(2, 6)]})
    assert first["seq-2"] >= first["seq-1"]


def test_on_the_engine_a_short_request_decodes_while_a_long_prompt_is_prefilled() -> None:
    """The bundled model, float32: a 1,200-token prompt at 64 tokens a step while a short one arrives; the short
    one gets its first tokens while the long one still prefills, and both give the tokens an engine without the
    cap gives."""
    from frame import LLM

    def run(threshold: int) -> tuple[dict[str, list[int]], dict[str, int]]:
        llm = LLM(dtype="float32", max_model_len=2048, max_num_batched_tokens=256,
                  long_prefill_token_threshold=threshold, platform_options={"threads": 2})
        core = llm.engine
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        prompts = {"long": make_prompt(7, 1200, vocab=49_000), "short": make_prompt(8, 24, vocab=49_000)}
        tokens: dict[str, list[int]] = {"long": [], "short": []}
        first: dict[str, int] = {}
        core.add_request(EngineRequest(request_id="long", prompt_token_ids=prompts["long"], params=params,
                                       arrival_time=0.0))
        step = 0
        while core.has_unfinished():
            if step == 1:
                core.add_request(EngineRequest(request_id="short", prompt_token_ids=prompts["short"], params=params,
                                               arrival_time=1.0))
            step += 1
            for out in core.step():
                tokens[out.request_id] += out.new_token_ids
                first.setdefault(out.request_id, step)
        return tokens, first

    capped, capped_first = run(64)
    plain, plain_first = run(0)
    assert capped == plain
    assert capped_first["short"] == 2 and capped_first["long"] > capped_first["short"] + 4
    assert plain_first["short"] >= plain_first["long"]


@pytest.mark.parametrize(("settings", "cap"), [
    ({}, 256),                                                    # the offline budget of 4096, / 16
    ({"max_num_batched_tokens": 2048}, 128),                      # frame serve's
    ({"long_prefill_token_threshold": 300}, 300),
    ({"long_prefill_token_threshold": 0}, 0),                     # off
    ({"enable_chunked_prefill": False, "max_model_len": 4096}, 0),  # whole prompts: nothing is cut
])
def test_the_configured_cap_reaches_the_limits_and_the_startup_summary(settings: dict, cap: int) -> None:
    from frame.config import EngineConfig
    from frame.summary import _long_prefills

    config = EngineConfig(**settings)
    assert config.long_prefill_tokens == cap
    assert _long_prefills(config) == (f", a long prefill {cap} of them while others run or wait" if cap else "")
