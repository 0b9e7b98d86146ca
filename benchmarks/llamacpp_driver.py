"""llama.cpp's side of ``benchmarks/compare_llamacpp.py``; runs in llama-cpp-python's own interpreter (it never
imports frame).

``python llamacpp_driver.py SPEC.json``: loads the GGUF named in the file with llama-cpp-python, warms it up,
prints ``READY``, then answers one line per command on stdin:

- ``run``: generates every prompt (token ids, greedy, no stop at EOS, each its own ``max_tokens``), one after
  another, and prints ``RESULT {json}`` (elapsed seconds, output tokens, the tokens, time to first token); with
  ``"batched": true`` in the spec all prompts decode together instead, one sequence each in every
  ``llama_decode`` (llama.cpp's ``batched`` example: one batch of every prompt, then one of a token per sequence);
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


def generate_batched(ctx: Any, prompts: list[list[int]], max_tokens: list[int], vocab: int) -> tuple[list[list[int]],
                                                                                                     float]:
    """Greedy tokens of every prompt decoded together (sequence ``i`` is prompt ``i``), from an empty cache, and the
    seconds to the first tokens (the prompts' batch)."""
    import llama_cpp
    import numpy as np

    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    total = sum(map(len, prompts))
    batch = llama_cpp.llama_batch_init(max(total, len(prompts)), 0, 1)
    try:
        start = time.perf_counter()
        batch.n_tokens = 0
        rows: list[int] = []
        for seq, prompt in enumerate(prompts):
            for pos, token in enumerate(prompt):
                j = batch.n_tokens
                batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.seq_id[j][0] = token, pos, 1, seq
                batch.logits[j] = pos == len(prompt) - 1
                batch.n_tokens += 1
            rows.append(batch.n_tokens - 1)
        outputs: list[list[int]] = [[] for _ in prompts]
        first = 0.0
        while True:
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed on the batch")
            for seq, row in enumerate(rows):
                if row >= 0:
                    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, row), shape=(vocab,))
                    outputs[seq].append(int(np.argmax(logits)))
            if not first:
                first = time.perf_counter() - start
            batch.n_tokens, rows = 0, []
            for seq, out in enumerate(outputs):
                if len(out) < max_tokens[seq]:
                    j = batch.n_tokens
                    batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.seq_id[j][0] = (
                        out[-1], len(prompts[seq]) + len(out) - 1, 1, seq)
                    batch.logits[j] = True
                    batch.n_tokens += 1
                    rows.append(j)
                else:
                    rows.append(-1)
            if batch.n_tokens == 0:
                return outputs, first
    finally:
        llama_cpp.llama_batch_free(batch)


def batched_context(llm: Any, spec: dict[str, Any]) -> Any:
    """A context of its own on ``llm``'s model for ``len(prompts)`` sequences sharing one KV buffer."""
    import llama_cpp

    prompts = spec["prompts"]
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = sum(len(p) + m for p, m in zip(prompts, spec["max_tokens"], strict=True)) + 256
    params.n_batch = params.n_ubatch = max(512, sum(map(len, prompts)))
    params.n_seq_max = len(prompts)
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = spec["threads"]
    ctx = llama_cpp.llama_init_from_model(llm._model.model, params)
    if ctx is None:
        raise RuntimeError("llama.cpp made no batched context")
    return ctx


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
    batched = batched_context(llm, spec) if spec.get("batched") else None
    if batched is not None:
        generate_batched(batched, prompts, [2] * len(prompts), llm.n_vocab())
    else:
        generate(llm, spec.get("warmup_prompt", prompts[0]), 4)  # warm-up: thread pool, first kernels
    print(f"READY llama_cpp {llama_cpp.__version__}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "run":
            start = time.perf_counter()
            outputs, firsts = [], []
            if batched is not None:
                outputs, first = generate_batched(batched, prompts, max_tokens, llm.n_vocab())
                firsts = [first]
            for prompt, limit in zip(prompts, max_tokens, strict=True) if batched is None else ():
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
                kv_type = spec.get("score_kv_type", 1)  # ggml's id; 1 (float16) is llama.cpp's own default
                scorer = Llama(n_ctx=len(chunks[0]), logits_all=True, type_k=kv_type, type_v=kv_type, **common)
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
