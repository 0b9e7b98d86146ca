"""vLLM's side of ``benchmarks/compare_vllm.py``; runs in vLLM's own interpreter (it never imports frame).

``python vllm_driver.py PROMPTS.json``: loads vLLM's offline ``LLM`` on the model named in the file, warms it
up, prints ``READY``, then for every ``run`` line on stdin generates all prompts (token ids, greedy,
``ignore_eos``, each its own ``max_tokens``) and prints one ``RESULT {json}`` line; ``quit`` ends it. Only lines
starting with ``READY``/``RESULT`` are protocol, so vLLM's own logging on stdout does no harm.

The warm-up runs the whole workload once, untimed: vLLM's CPU build compiles the model with torch.compile /
inductor and its first passes over new batch shapes are slow, so a tiny warm-up request would leave that cost
in the first timed round. Extra ``LLM`` keyword arguments come from the file's ``engine_args``; vLLM's CPU
settings that are environment variables (``VLLM_CPU_*``) are set by the caller when it starts this process.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def engine_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """The ``LLM(...)`` keyword arguments for ``spec``: the fixed comparison settings plus its ``engine_args``."""
    kwargs: dict[str, Any] = {
        "model": spec["model"], "tokenizer": spec.get("tokenizer"), "dtype": spec["dtype"],
        "max_model_len": spec["max_model_len"], "seed": 0,
        "enable_prefix_caching": spec.get("prefix_caching", True),
        # On the CPU backend this is the share of RAM vLLM reserves; its 0.92 default fails beside frame.
        # VLLM_CPU_KVCACHE_SPACE (GiB), when the caller sets it, takes precedence for the KV cache size.
        "gpu_memory_utilization": spec.get("memory_utilization", 0.5),
    }
    kwargs.update(spec.get("engine_args", {}))
    return kwargs


def main(path: str) -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(Path(path).read_text())
    llm = LLM(**engine_kwargs(spec))
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    # frame's driver returns token ids and never detokenizes, so vLLM need not either.
    detokenize = spec.get("detokenize", False)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, detokenize=detokenize)
              for m in spec["max_tokens"]]
    for _ in range(spec.get("warmup_rounds", 1)):  # the whole workload, so every batch shape is compiled
        llm.generate(prompts, params, use_tqdm=False)
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        llm.reset_prefix_cache()  # every round starts cold, as frame's does
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        result = {"elapsed_s": elapsed, "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                  "outputs": [list(o.outputs[0].token_ids) for o in outputs]}
        if len(prompts) == 1 and spec["max_tokens"] == [1]:  # the round was a cold one-token generation already
            result["ttft_s"] = elapsed
        elif len(prompts) == 1:  # a latency workload: time to first token is a cold one-token generation
            llm.reset_prefix_cache()
            start = time.perf_counter()
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=1, detokenize=detokenize),
                         use_tqdm=False)
            result["ttft_s"] = time.perf_counter() - start
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
