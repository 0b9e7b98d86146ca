"""llama.cpp's side of :mod:`frame.testing.llamacpp`, run by the interpreter of a virtual environment holding
llama-cpp-python (never frame's): ``python llamacpp_peer.py SPEC.json`` prints one JSON line.

The spec names a source GGUF, an output path and a llama.cpp preset (``Q4_K_M``, ``IQ4_XS``, ...): the source is
quantized into the preset with llama.cpp's own quantizer (``llama_model_quantize``, requantizing allowed), then
llama.cpp loads that file, continues ``prompt`` greedily for ``n_gen`` tokens, and scores each of ``chunks`` as
its perplexity tool does (second half, from an empty cache).

llama.cpp keeps its KV cache in float16 unless told otherwise (and then rounds each query and each row of attention
weights to float16 too, its dot products' type for float16 K and V); frame, run in float32 here, keeps keys and
values in float32. The peer asks for a float32 cache, so both programs compute the same function and differ only
in the order of float32 sums: on the matrix's Qwen2-MoE Q4_K_M file llama.cpp's own perplexity moves by 1.0%
between its float16 and float32 caches (367.70 and 364.12), more than the bound the two programs are held to.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path


def quantize(llama_cpp, source: str, out: str, preset: str, threads: int) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{preset}")
    params.allow_requantize = True
    params.nthread = threads
    if llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed for {preset}")


def plain_layout(llama_cpp) -> None:
    """Models load in ggml's plain layout (``use_extra_bufts`` off): llama.cpp's AMX and repack buffers crash a
    batched eval of llama-cpp-python 0.3.36 on this project's Sapphire Rapids machine, and the plain kernels are
    the reference anyway."""
    default = llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = params
    import llama_cpp.llama as module

    module.llama_cpp.llama_model_default_params = params


#: ggml's type id of float32 (``GGML_TYPE_F32``), for the K and V caches.
GGML_TYPE_F32 = 0


def log_softmax_nll(rows, targets) -> float:
    import numpy as np

    shifted = rows - rows.max(axis=1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-logprobs[np.arange(len(targets)), targets].sum())


def main(path: str) -> int:
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    spec = json.loads(Path(path).read_text())
    if not Path(spec["out"]).exists():
        quantize(llama_cpp, spec["source"], spec["out"], spec["preset"], spec["threads"])
    plain_layout(llama_cpp)
    n_ctx = max(len(spec["prompt"]) + spec["n_gen"], *(len(c) for c in spec["chunks"]))
    llm = Llama(model_path=spec["out"], n_ctx=n_ctx, n_batch=n_ctx, n_threads=spec["threads"],
                n_threads_batch=spec["threads"], logits_all=True, seed=0, verbose=False,
                type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    llm.reset()
    llm.eval(spec["prompt"])
    continuation: list[int] = []
    while len(continuation) < spec["n_gen"]:
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        continuation.append(token)
        llm.eval([token])
    nll, count = 0.0, 0
    for chunk in spec["chunks"]:
        llm.reset()
        llm.eval(chunk)
        first = len(chunk) // 2
        rows = np.asarray(llm.scores[first : len(chunk) - 1], dtype=np.float64)
        nll += log_softmax_nll(rows, np.asarray(chunk[first + 1 :]))
        count += len(chunk) - first - 1
    print(json.dumps({"continuation": continuation, "nll": nll, "tokens": count,
                      "version": llama_cpp.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
