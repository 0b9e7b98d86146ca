"""The step plan is data: every plan crosses msgpack unchanged, and the decoded copy is all a runner needs."""

from __future__ import annotations

import msgspec
import pytest
from frame.engine.wire.codec import decode, encode
from frame.engine.wire.plan import RequestSample, RunnerOutput, SchedulerOutput
from frame.engine.wire.requests import EngineRequest, TokenLogprobs
from frame.interfaces.scheduler import SchedulerLimits
from frame.sampling_params import SamplingParams
from frame.testing.scheduler import SchedulerHarness, cache_factory_for, make_prompt, scheduler_plugin_factory


def test_a_real_engine_step_round_trips_and_runs_from_the_decoded_copy() -> None:
    from frame import LLM

    llm = LLM(dtype="float32", max_model_len=256, cache="radix")
    core = llm.engine
    params = SamplingParams(temperature=0.7, top_k=20, seed=11, max_tokens=3, logprobs=2, stop=["x"])
    for i, prompt in enumerate([[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 6]]):
        core.add_request(EngineRequest(request_id=f"r{i}", prompt_token_ids=prompt, params=params,
                                       arrival_time=float(i)))
    plan = core.scheduler.schedule()
    data = encode(plan)
    decoded = decode(data, SchedulerOutput)
    assert decoded == plan and isinstance(decoded.new_requests[0].params, SamplingParams)
    assert decoded.new_requests[0].params.stop == ["x"] and len(decoded.new_requests) == 3
    output = core.executor.execute(decoded)  # the worker only ever sees the decoded copy
    assert decode(encode(output), RunnerOutput) == output
    core.scheduler.update(plan, output)
    assert [len(s.token_ids) for s in output.samples] == [1, 1, 1]
    assert all(s.logprobs and len(s.logprobs[0].top) == 2 for s in output.samples)


def test_every_plan_of_a_workload_with_preemption_and_copies_round_trips() -> None:
    """radix over a small pool: partial-block copies, preemptions, resumed requests and ended ones all occur, and
    the simulated runner runs each step from the decoded plan alone."""
    cache = cache_factory_for("radix")(12, 4)
    limits = SchedulerLimits(max_num_seqs=3, max_num_batched_tokens=16, max_model_len=128)
    h = SchedulerHarness(scheduler_plugin_factory("fcfs")(limits), cache, limits)
    stem = make_prompt(1, 10)
    seqs = [h.add([*stem, *make_prompt(10 + i, 3 + i)], max_tokens=8) for i in range(6)]
    seen = {"copies": 0, "preempted": 0, "resumed": 0, "finished": 0}
    while h.scheduler.has_unfinished():
        plan = h.scheduler.schedule()
        h._check_schedule(plan)
        decoded = decode(encode(plan), SchedulerOutput)
        assert decoded == plan
        seen["copies"] += len(plan.block_copies)
        seen["preempted"] += len(plan.preempted_ids)
        seen["resumed"] += sum(r.resumed for r in plan.running)
        seen["finished"] += len(plan.finished_ids)
        h.finish_step(plan, h.model.execute(decoded))
    assert all(seen.values()), seen
    for seq in seqs:
        assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, 8)
    h.assert_no_leak()


def test_plans_and_outputs_are_immutable_values() -> None:
    plan = SchedulerOutput(step=1)
    with pytest.raises(AttributeError):
        plan.step = 2  # type: ignore[misc]
    output = RunnerOutput(samples=[RequestSample("a", [3], [TokenLogprobs(3, -0.5, [(3, -0.5)])])])
    assert msgspec.msgpack.decode(encode(output), type=RunnerOutput) == output


def test_a_plan_only_moves_decodes_on_when_nothing_but_one_token_each_changes() -> None:
    from frame.engine.wire.plan import BlockCopy, RunningRequest

    def decode_of(**changes) -> RunningRequest:
        return RunningRequest(**{**dict(req_id="a", new_block_ids=[], num_computed_tokens=40, num_new_tokens=1,
                                        samples=True, new_group_block_ids=[[]]), **changes})

    def plan(*running: RunningRequest, **changes) -> SchedulerOutput:
        return SchedulerOutput(**{**dict(step=1, num_prompt_tokens=0, new_requests=[], running=list(running)),
                                  **changes})

    assert plan(decode_of(), decode_of(req_id="b")).only_moves_decodes_on
    assert plan(decode_of(new_block_ids=[7]), decode_of(req_id="b", new_group_block_ids=[[8]])).only_moves_decodes_on
    for changed in (dict(num_new_tokens=2), dict(samples=False), dict(resumed=True), dict(spec_token_ids=[3])):
        assert not plan(decode_of(), decode_of(req_id="b", **changed)).only_moves_decodes_on, changed
    for changed in (dict(finished_ids=["c"]), dict(preempted_ids=["c"]), dict(grammar_ids=["a"]),
                    dict(block_copies=[BlockCopy(src=1, dst=2, num_tokens=3)])):
        assert not plan(decode_of(), **changed).only_moves_decodes_on, changed
