"""Host cost of one batch-64 decode step of the whole engine: Python calls and milliseconds outside the model.

    .venv/bin/python benchmarks/profile_engine_step.py [--batch 64] [--steps 20] [--dtype float32]

Builds an EngineCore over the bundled SmolLM2-135M-Instruct, admits ``--batch`` greedy requests with prompts of
50-500 random token ids, steps until every prompt is computed, then measures ``--steps`` pure decode steps:

- wall milliseconds per step, and the part spent inside the model's forward and logits (the rest is host work:
  scheduling, building the batch's inputs, sampling, updating, outputs);
- Python calls per step (``sys.setprofile`` events: Python functions and C builtins), inside and outside the
  model, counted in a separate pass so the counting does not inflate the times.

The script finds the model through the engine, so the same file measures an older checkout too (put that tree's
``framework`` and plugin folders first on ``PYTHONPATH``) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.engine.wire.requests import EngineRequest
from frame.sampling_params import SamplingParams


def find_inside(core: EngineCore, paths: tuple[str, ...]) -> Any:
    """The first attribute path of ``paths`` that this version of the engine has (e.g. ``executor.worker.runner``)."""
    for path in paths:
        obj: Any = core
        try:
            for attr in path.split("."):
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        return obj
    raise SystemExit(f"cannot find any of {', '.join(paths)} inside this EngineCore")


def find_model(core: EngineCore) -> Any:
    """The engine's model, wherever this version of the engine keeps it."""
    return find_inside(core, ("runner.model", "executor.worker.runner.model", "executor.driver.runner.model"))


class ModelMeter:
    """Wraps the model's forward and logits: time spent inside them, and whether a call is inside now."""

    def __init__(self, model: Any) -> None:
        self.seconds = 0.0
        self.inside = False
        for name in ("forward", "compute_logits"):
            setattr(model, name, self._wrap(getattr(model, name)))

    def _wrap(self, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.inside = True
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.inside = False
        return wrapper


def build(batch: int, dtype: str, seed: int) -> EngineCore:
    config = build_config(dtype=dtype, max_num_seqs=batch, max_model_len=2048, seed=seed)
    core = EngineCore(config)
    rng = random.Random(seed)
    vocab = int(core.source.hf_config.vocab_size)
    for i in range(batch):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(50, 500))]
        params = SamplingParams(temperature=0.0, max_tokens=1024, ignore_eos=True)
        core.add_request(EngineRequest(request_id=f"r{i}", prompt_token_ids=prompt, params=params,
                                       arrival_time=float(i)))
    while True:  # every prompt computed: the next steps are pure decode
        outputs = core.step()
        if len(outputs) == batch:
            return core


def count_calls(core: EngineCore, meter: ModelMeter, steps: int) -> tuple[float, float]:
    """Mean Python calls per step outside and inside the model."""
    counts = {"outside": 0, "inside": 0}

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            counts["inside" if meter.inside else "outside"] += 1

    sys.setprofile(profiler)
    try:
        for _ in range(steps):
            core.step()
    finally:
        sys.setprofile(None)
    return counts["outside"] / steps, counts["inside"] / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    core = build(args.batch, args.dtype, args.seed)
    meter = ModelMeter(find_model(core))
    walls, hosts = [], []
    for _ in range(args.steps):
        meter.seconds = 0.0
        start = time.perf_counter()
        outputs = core.step()
        wall = time.perf_counter() - start
        assert len(outputs) == args.batch, "a step that is not a full decode step"
        walls.append(wall * 1000)
        hosts.append((wall - meter.seconds) * 1000)
    outside, inside = count_calls(core, meter, max(3, args.steps // 4))
    print(f"batch {args.batch} decode step, {args.dtype}: wall median {statistics.median(walls):.1f} ms, "
          f"host (outside the model) median {statistics.median(hosts):.2f} ms, min {min(hosts):.2f} ms")
    print(f"Python calls per step: {outside:.0f} outside the model, {inside:.0f} inside it")


if __name__ == "__main__":
    main()
