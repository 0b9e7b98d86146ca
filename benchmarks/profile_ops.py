"""Operator profile of frame's steps on issue #6's mixed batch: the prefill steps, then a few decode steps.

    .venv/bin/python benchmarks/profile_ops.py [--dtype bfloat16] [--decode-steps 3] [--rows 20]
"""

from __future__ import annotations

import argparse
import time

import torch
from frame.bench.driver import warm_up
from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.engine.wire.requests import EngineRequest
from frame.workloads.batch import BATCH_WORKLOADS


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--decode-steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    engine = EngineCore(build_config(None, dtype=args.dtype))
    workload = {w.name: w for w in BATCH_WORKLOADS}["mixed_batch"]
    requests = workload.generate(engine.source.tokenizer)
    warm_up(engine)
    for i, r in enumerate(requests):
        engine.add_request(EngineRequest(request_id=f"r{i}", prompt_token_ids=list(r.prompt_token_ids),
                                         params=r.params, arrival_time=time.monotonic()))
    for phase in ("prefill", "decode"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t, steps = time.perf_counter(), 0
            while True:
                if phase == "prefill" and engine.scheduler.num_waiting == 0 and steps and all(
                        s.num_computed_tokens >= s.num_prompt_tokens for s in engine._seqs.values()):
                    break
                if phase == "decode" and steps == args.decode_steps:
                    break
                engine.step()
                steps += 1
        print(f"== {phase}: {steps} steps, {(time.perf_counter() - t) / steps * 1000:.1f} ms/step")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
