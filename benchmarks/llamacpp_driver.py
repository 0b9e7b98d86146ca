"""llama.cpp's side of ``benchmarks/compare_llamacpp.py``; runs in llama-cpp-python's own interpreter (it never
imports frame).

``python llamacpp_driver.py SPEC.json``: loads the GGUF named in the file with llama-cpp-python, warms it up,
prints ``READY``, then answers one line per command on stdin:

- ``run``: generates every prompt (token ids, greedy, no stop at EOS, each its own ``max_tokens``), one after
  another, and prints ``RESULT {json}`` (elapsed seconds, output tokens, the tokens, time to first token);
- ``perplexity``: evaluates every chunk of the file's ``chunks`` from an empty cache and prints ``PERPLEXITY
  {json}`` with the negative log-likelihood of each chunk's second half, computed from llama.cpp's logits exactly
  as ``frame.bench.perplexity.score`` does;
- ``quit`` (or end of input) ends it.

Decoding is llama.cpp's: ``Llama.eval`` (``llama_decode``) for the prompt and each new token, and the greedy token
taken as the argmax of its logits, which is llama.cpp's greedy sampler. Only lines starting with ``READY``,
``RESULT`` and ``PERPLEXITY`` are protocol.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any


def generate(llm: Any, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    """Greedy tokens after ``prompt`` (from an empty cache) and the seconds to the first one."""
    import numpy as np

    llm.reset()
    start = time.perf_counter()
    if PREFILL_BY_TOKEN:
        for token in prompt:
            llm.eval([token])
    else:
        llm.eval(prompt)
    out: list[int] = []
    first = 0.0
    vocab = llm.n_vocab()
    while len(out) < max_tokens:
        # The last position's logits straight from llama.cpp: without logits_all, llama-cpp-python 0.3 no longer
        # copies them into ``scores`` (``eval_logits`` would be stale, and it converts every row to a list).
        token = int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,))))
        if not out:
            first = time.perf_counter() - start
        out.append(token)
        if len(out) < max_tokens:
            llm.eval([token])
    return out, first


def chunk_nll(llm: Any, chunk: list[int]) -> tuple[float, int]:
    """Negative log-likelihood of the chunk's second half, from an empty cache (float64 log-softmax)."""
    import numpy as np

    llm.reset()
    llm.eval(chunk)
    logits = np.asarray(llm.scores[: len(chunk)], dtype=np.float64)
    first = len(chunk) // 2
    rows = logits[first:-1]
    shifted = rows - rows.max(axis=1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    targets = np.asarray(chunk[first + 1 :])
    return float(-logprobs[np.arange(len(targets)), targets].sum()), len(targets)


#: Set from the spec: feed the prompt one token at a time (for llama.cpp builds whose batched path fails here).
PREFILL_BY_TOKEN = False


def use_extra_buffers(llama_cpp: Any, on: bool) -> None:
    """llama.cpp's weight repacking buffers (its AMX and repack kernels): on by default; ``on`` False makes every
    model this process loads keep ggml's plain layout."""
    default = llama_cpp.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = on
        return p

    llama_cpp.llama_model_default_params = params
    import llama_cpp.llama as module

    module.llama_cpp.llama_model_default_params = params


def main(path: str) -> int:
    global PREFILL_BY_TOKEN
    import llama_cpp
    from llama_cpp import Llama

    spec = json.loads(Path(path).read_text())
    PREFILL_BY_TOKEN = spec.get("prefill", "batch") == "tokens"
    use_extra_buffers(llama_cpp, spec.get("extra_buffers", True))
    common = {"model_path": spec["model"], "n_threads": spec["threads"], "n_threads_batch": spec["threads"],
              "n_batch": spec.get("n_batch", 512), "seed": 0, "verbose": False}
    llm = Llama(n_ctx=spec["n_ctx"], **common)
    scorer = None
    prompts, max_tokens = spec["prompts"], spec["max_tokens"]
    generate(llm, prompts[0], 4)  # warm-up: thread pool, first kernels
    print(f"READY llama_cpp {llama_cpp.__version__}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "run":
            start = time.perf_counter()
            outputs, firsts = [], []
            for prompt, limit in zip(prompts, max_tokens, strict=True):
                tokens, first = generate(llm, prompt, limit)
                outputs.append(tokens)
                firsts.append(first)
            elapsed = time.perf_counter() - start
            result: dict[str, Any] = {"elapsed_s": elapsed, "output_tokens": sum(map(len, outputs)),
                                      "outputs": outputs, "first_token_s": sum(firsts)}
            if len(prompts) == 1:
                result["ttft_s"] = firsts[0]
            print("RESULT " + json.dumps(result), flush=True)
        elif command == "perplexity":
            chunks = spec["chunks"]
            if scorer is None:  # every position's logits: only the scoring model keeps them all
                use_extra_buffers(llama_cpp, spec.get("score_extra_buffers", spec.get("extra_buffers", True)))
                scorer = Llama(n_ctx=len(chunks[0]), logits_all=True, **common)
            start = time.perf_counter()
            nll, count = 0.0, 0
            for chunk in chunks:
                part, scored = chunk_nll(scorer, chunk)
                nll, count = nll + part, count + scored
            print("PERPLEXITY " + json.dumps({"nll": nll, "tokens": count, "chunks": len(chunks),
                                             "perplexity": math.exp(nll / count),
                                             "seconds": time.perf_counter() - start}), flush=True)
        else:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
