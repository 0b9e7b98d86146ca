"""vLLM's side of ``benchmarks/compare_vllm.py``; runs in vLLM's own interpreter (it never imports frame).

``python vllm_driver.py PROMPTS.json``: loads vLLM's offline ``LLM`` on the model named in the file, warms it
up, prints ``READY``, then for every ``run`` line on stdin generates all prompts (token ids, greedy,
``ignore_eos``, each its own ``max_tokens``) and prints one ``RESULT {json}`` line; ``quit`` ends it. Only lines
starting with ``READY``/``RESULT`` are protocol, so vLLM's own logging on stdout does no harm.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(path: str) -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(Path(path).read_text())
    llm = LLM(model=spec["model"], tokenizer=spec.get("tokenizer"), dtype=spec["dtype"],
              max_model_len=spec["max_model_len"], seed=0, enable_prefix_caching=spec.get("prefix_caching", True),
              # On the CPU backend this is the share of RAM vLLM reserves; its 0.92 default fails beside frame.
              gpu_memory_utilization=spec.get("memory_utilization", 0.5))
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in spec["max_tokens"]]
    llm.generate([TokensPrompt(prompt_token_ids=list(range(100, 108)))],
                 SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
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
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
