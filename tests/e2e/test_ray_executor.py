"""The Ray form of the executor: two ranks as Ray actors on a local Ray give one process's greedy tokens, and an
actor killed mid-generation fails the step with WorkerDiedError instead of hanging. Dense weights: read packed
(a .gguf's default), two ranks part from one at int8-rounding near-ties (test_tensor_parallel.py covers that)."""

from __future__ import annotations

import time

import pytest
from frame import LLM, SamplingParams
from frame.engine.core.executor import WorkerDiedError
from frame.engine.wire.requests import EngineRequest

ray = pytest.importorskip("ray", reason="ray is the optional extra frame-engine[ray]")
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_two_ray_ranks_equal_one_process_and_a_killed_actor_fails_fast(local_ray, chat_prompts) -> None:
    prompts = [{"prompt_token_ids": p} for p in chat_prompts[:3]]
    single = LLM(max_model_len=256, dtype="float32", quantization="none")
    expected = [r.outputs[0].token_ids for r in single.generate(prompts, GREEDY)]
    llm = LLM(max_model_len=256, dtype="float32", quantization="none", tensor_parallel_size=2,
              distributed_backend="ray")
    assert [r.outputs[0].token_ids for r in llm.generate(prompts, GREEDY)] == expected

    core = llm.engine
    core.add_request(EngineRequest(request_id="long", prompt_token_ids=chat_prompts[0], arrival_time=0.0,
                                   params=SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)))
    core.step()
    ray.kill(core.executor._actors[1])
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match="rank 1"):
        for _ in range(200):
            core.step()
    assert time.monotonic() - started < 10
