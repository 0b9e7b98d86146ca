"""Drive an EngineCore through a workload's requests, timing every request in the engine loop."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from frame.bench.metrics import RequestTiming, summarize
from frame.engine.client.sync import DataParallelEngine
from frame.engine.core.engine_core import EngineCore
from frame.engine.wire.requests import EngineRequest, EngineStats
from frame.interfaces.workload import WorkloadRequest, greedy

#: What the driver steps: one engine core in this process, or data-parallel cores behind the same calls.
Engine = EngineCore | DataParallelEngine

#: EngineStats counters that only grow; a run reports their increase over the run.
COUNTERS = ("prefix_queries", "prefix_query_tokens", "prefix_hit_tokens", "evictions", "preemptions",
            "prompt_tokens_computed", "generation_tokens", "steps", "comm_seconds", "spec_draft_tokens",
            "spec_accepted_tokens", "spec_verifications")


@dataclass
class DriveResult:
    """What one run measured: per-request timings (in request order), wall time, and the engine's stats
    (counters as their increase over the run, gauges as they stood at its end)."""

    timings: list[RequestTiming]
    elapsed: float
    stats: dict[str, Any]

    def summary(self) -> dict[str, float]:
        out = summarize(self.timings, self.elapsed)
        out.update({k: self.stats[k] for k in ("prompt_tokens_computed", "peak_blocks_in_use", "num_blocks",
                                               "evictions", "preemptions", "steps")})
        steps = self.stats["steps"]
        # Tensor parallelism: the driver rank's time in collectives, per step and as a share of the wall time.
        out["comm_ms_per_step"] = 1000 * self.stats["comm_seconds"] / steps if steps else 0.0
        out["comm_share"] = self.stats["comm_seconds"] / self.elapsed if self.elapsed else 0.0
        # Speculative decoding: the share of draft tokens the target kept (NaN, shown as a dash, without drafts).
        drafted = self.stats["spec_draft_tokens"]
        out["spec_draft_tokens"] = drafted
        out["spec_acceptance"] = self.stats["spec_accepted_tokens"] / drafted if drafted else float("nan")
        return out


def _delta(before: EngineStats, after: EngineStats) -> dict[str, Any]:
    stats: dict[str, Any] = msgspec.structs.asdict(after)
    for key in COUNTERS:
        stats[key] = getattr(after, key) - getattr(before, key)
    return stats


def warm_up(engine: Engine, num_tokens: int = 2) -> None:
    """One tiny request per engine core, at once, so one-time costs (thread pools, first kernels) stay out of the
    measured run."""
    for rank in range(engine.config.data_parallel_size):
        engine.add_request(EngineRequest(request_id=f"warm-up-{rank}", prompt_token_ids=list(range(100 + rank, 108)),
                                         params=greedy(num_tokens), arrival_time=time.monotonic()))
    while engine.has_unfinished():
        engine.step()


def drive(engine: Engine, requests: Sequence[WorkloadRequest],
          on_tokens: Callable[[int], None] | None = None) -> DriveResult:
    """Submit ``requests`` wave by wave and step the engine until all finish.

    TTFT is the time from a request's submission to the step that returned its first token; a wave's
    requests are all submitted at once, so TTFT includes queueing behind the rest of the wave.
    ``on_tokens(n)`` is called with the number of new tokens after every step (progress bars).
    """
    with torch.inference_mode():  # once for the run, not once a step (ModelRunner.execute)
        return _drive(engine, requests, on_tokens)


def _drive(engine: Engine, requests: Sequence[WorkloadRequest],
           on_tokens: Callable[[int], None] | None) -> DriveResult:
    before = msgspec.structs.replace(engine.stats())
    timings: dict[str, RequestTiming] = {}
    start = time.perf_counter()
    for wave in sorted({r.wave for r in requests}):
        for index, req in enumerate(requests):
            if req.wave != wave:
                continue
            rid = f"bench-{index}"
            timings[rid] = RequestTiming(len(req.prompt_token_ids), time.perf_counter())
            engine.add_request(EngineRequest(
                request_id=rid, prompt_token_ids=list(req.prompt_token_ids), params=req.params,
                arrival_time=time.monotonic(), priority=req.priority, cache_salt=req.cache_salt,
            ))
        while engine.has_unfinished():
            outputs = engine.step()
            now = time.perf_counter()
            new = 0
            for out in outputs:
                timing = timings[out.request_id]
                if out.new_token_ids and timing.first_token is None:
                    timing.first_token = now
                timing.output_token_ids.extend(out.new_token_ids)
                new += len(out.new_token_ids)
                if out.finished:
                    timing.finished = now
                    timing.num_cached_tokens = out.num_cached_tokens
            if on_tokens is not None:
                on_tokens(new)
    elapsed = time.perf_counter() - start
    ordered = [timings[f"bench-{i}"] for i in range(len(requests))]
    return DriveResult(ordered, elapsed, _delta(before, engine.stats()))
