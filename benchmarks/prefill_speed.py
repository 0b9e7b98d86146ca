"""Prefill speed of one prompt at a time, offline: tokens/s at several lengths and attention's share of the time.

    .venv/bin/python benchmarks/prefill_speed.py [--lengths 512,2048,8000] [--rounds 3] [--dtype bfloat16] \\
        [--attn cpu_paged] [--max-num-batched-tokens 2048] [--quantization none] [--json FILE]

One EngineCore in this process (the bundled SmolLM2-135M unless --model; config defaults otherwise). Each round
prefills one new prompt of each length (long_prefill.py's text, headed by the round and length) with
``max_tokens`` 1, so the time to the first token is the prefill (the prefix cache is reset before each), while the
attention backend's ``forward`` calls are timed (every live backend class is wrapped), so attention's share is its
wall time over the prefill's. Prints each length's median tokens/s and share over the rounds, and the process's CPU
seconds per prefill (every thread's: on a host shared with other work the wall time stretches with the neighbours'
load, the CPU time far less, so compare checkouts by it there); ``--json`` writes them with ``rounds.frame``
(tokens/s of the longest length per round), the value ``compare_checkouts.py`` compares between two checkouts.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import time
from pathlib import Path

from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.engine.wire.requests import EngineRequest
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.workload import greedy
from long_prefill import long_prompt


class AttentionClock:
    """Wall time spent in attention backends' ``forward``: wraps the method on every live backend's class."""

    def __init__(self) -> None:
        self.seconds = 0.0
        classes = {type(o) for o in gc.get_objects() if isinstance(o, AttentionBackend)}
        if not classes:
            raise RuntimeError("no attention backend is alive in this process: is the engine in another one?")
        for cls in classes:
            cls.forward = self._timed(cls.forward)

    def _timed(self, forward):
        @functools.wraps(forward)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return wrapper


def prefill(engine: EngineCore, ids: list[int], clock: AttentionClock) -> tuple[float, float, float]:
    """Seconds to the first token of one request, attention's seconds within them, and the process's CPU seconds."""
    engine.cache.reset()
    before = clock.seconds
    start, cpu = time.perf_counter(), time.process_time()
    engine.add_request(EngineRequest(request_id=f"prefill-{start}", prompt_token_ids=ids, params=greedy(1),
                                     arrival_time=time.monotonic()))
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start, clock.seconds - before, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,2048,8000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attn", default="cpu_paged")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--quantization", default=None,
                        help="frame's --quantization (default: the config's; the bundled GGUF then runs packed): none "
                             "runs the dense weights compare_ttft.py gives frame and vLLM")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    overrides = {"max_num_batched_tokens": args.max_num_batched_tokens} if args.max_num_batched_tokens else {}
    if args.quantization:
        overrides["quantization"] = args.quantization
    engine = EngineCore(build_config(None, model=args.model, dtype=args.dtype, attn=args.attn,
                                     kv_cache_dtype=args.kv_cache_dtype, max_model_len=max(lengths) + 8, **overrides))
    clock = AttentionClock()
    tokenizer = engine.source.tokenizer
    prefill(engine, long_prompt(tokenizer, 64, -1), clock)
    rates: dict[int, list[float]] = {n: [] for n in lengths}
    shares: dict[int, list[float]] = {n: [] for n in lengths}
    cpu: dict[int, list[float]] = {n: [] for n in lengths}
    for r in range(args.rounds):
        for n in lengths:
            seconds, attention, cpu_seconds = prefill(engine, long_prompt(tokenizer, n, r * 100_000 + n), clock)
            rates[n].append(n / seconds)
            shares[n].append(attention / seconds)
            cpu[n].append(cpu_seconds)
    print(f"{engine.selection.dtype}, attention {engine.selection.attn}, {args.rounds} rounds")
    report = {"lengths": {}, "rounds": {"frame": rates[max(lengths)]}}
    for n in lengths:
        rate, share = statistics.median(rates[n]), statistics.median(shares[n])
        report["lengths"][n] = {"tokens_per_s": rates[n], "attention_share": shares[n], "cpu_seconds": cpu[n]}
        print(f"{n:6d} tokens: {rate:8.1f} tok/s (TTFT {n / rate:6.2f} s), attention {share:.0%}, "
              f"process CPU {statistics.median(cpu[n]):6.2f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
