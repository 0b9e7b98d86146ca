"""What structured output costs a batch-64 decode step: the grammar masks against the step they constrain.

    .venv/bin/python benchmarks/grammar_mask.py [--batch 64] [--steps 10] [--dtype float32] [--rounds 2] [--threads 1]

Builds two EngineCores over the bundled SmolLM2-135M-Instruct with the same ``--batch`` greedy requests (prompts of
50-500 random token ids), one of them with every request held to a nested JSON schema (objects, enums, an array
of at least 64 items, bounded integers, so that no request can finish inside the measured steps). After every
prompt is computed it times pure decode steps, rounds alternating between the two cores, and inside the
constrained core the three places the grammar costs time:

- the engine core filling one mask row per request from its matcher (``StructuredOutputManager.masks``) and
  packing the rows into the plan;
- the runner unpacking the rows and setting disallowed logits to -inf;
- the engine core advancing every matcher over the step's tokens.

It prints each part's median per step, their sum as a share of the constrained step, and the two cores' step
times side by side (the difference also holds what the parts miss, such as the larger plan message).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.engine.wire.requests import EngineRequest
from frame.sampling_params import SamplingParams, StructuredOutputs
from profile_engine_step import find_inside

SCHEMA = {
    "type": "object",
    "properties": {
        "order": {"type": "integer", "minimum": 0, "maximum": 10**6},
        "status": {"enum": ["open", "paid", "shipped", "returned"]},
        "lines": {"type": "array", "minItems": 64, "items": {
            "type": "object",
            "properties": {
                "sku": {"type": "string", "maxLength": 12},
                "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                "price": {"type": "number"},
                "tags": {"type": "array", "items": {"enum": ["gift", "fragile", "bulk"]}, "maxItems": 3},
            },
            "required": ["sku", "qty", "price", "tags"], "additionalProperties": False}},
    },
    "required": ["order", "status", "lines"],
    "additionalProperties": False,
}


class Timer:
    """Wraps ``owner.name``: total seconds spent inside it since the last ``take()``."""

    def __init__(self, owner: Any, name: str) -> None:
        self.seconds = 0.0
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        setattr(owner, name, timed)

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def build(batch: int, dtype: str, seed: int, constrained: bool, threads: int | None = None) -> EngineCore:
    platform = {"platform_options": {"threads": threads}} if threads else {}
    core = EngineCore(build_config(dtype=dtype, max_num_seqs=batch, max_model_len=2048, seed=seed, **platform))
    rng = random.Random(seed)
    vocab = int(core.source.hf_config.vocab_size)
    spec = StructuredOutputs(json=json.dumps(SCHEMA)) if constrained else None
    for i in range(batch):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(50, 500))]
        params = SamplingParams(temperature=0.0, max_tokens=1024, ignore_eos=True, structured_outputs=spec)
        core.add_request(EngineRequest(request_id=f"r{i}", prompt_token_ids=prompt, params=params,
                                       arrival_time=float(i)))
    while len(core.step()) < batch:  # every prompt computed: the next steps are pure decode
        pass
    return core


def step_ms(core: EngineCore, batch: int) -> float:
    start = time.perf_counter()
    outputs = core.step()
    elapsed = (time.perf_counter() - start) * 1000
    assert len(outputs) == batch and not any(o.finished for o in outputs), "not a full decode step"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10, help="decode steps per round and core")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="cpu platform threads (1 keeps a busy shared host's OpenMP barriers out of the ratio)")
    args = parser.parse_args()
    free = build(args.batch, args.dtype, args.seed, constrained=False, threads=args.threads)
    held = build(args.batch, args.dtype, args.seed, constrained=True, threads=args.threads)
    fill = Timer(held, "_with_grammar")
    apply = Timer(find_inside(held, ("executor.worker.runner", "executor.driver.runner")), "apply_grammar")
    follow = Timer(held, "_follow_grammars")
    parts: dict[str, list[float]] = {"fill masks": [], "apply masks": [], "advance matchers": []}
    free_ms: list[float] = []
    held_ms: list[float] = []
    for _ in range(args.rounds):
        free_ms += [step_ms(free, args.batch) for _ in range(args.steps)]
        for _ in range(args.steps):
            held_ms.append(step_ms(held, args.batch))
            for name, timer in zip(parts, (fill, apply, follow), strict=True):
                parts[name].append(timer.take() * 1000)
    held_median = statistics.median(held_ms)
    total = [sum(values) for values in zip(*parts.values(), strict=True)]
    print(f"batch {args.batch} decode step, {args.dtype}, {args.rounds} rounds x {args.steps} steps per core")
    for name, values in parts.items():
        print(f"  {name:<17} median {statistics.median(values):7.2f} ms per step")
    print(f"  grammar in all     median {statistics.median(total):7.2f} ms per step = "
          f"{100 * statistics.median(total) / held_median:.1f}% of the constrained step")
    print(f"step: unconstrained median {statistics.median(free_ms):.1f} ms, constrained {held_median:.1f} ms "
          f"({held_median / statistics.median(free_ms):.3f}x)")


if __name__ == "__main__":
    main()
