"""A Gemma 3 GGUF of a real model's shape with random weights, for speed measurements without a hub download:

    .venv/bin/python benchmarks/make_gemma3_gguf.py OUT_DIR [--shape 270m|1b] [--llamacpp-python PY]

writes ``OUT_DIR/gemma3-<shape>-random.Q8_0.gguf`` the way llama.cpp's converter writes Gemma 3 (norms stored
``+ 1``, five windowed layers to one global, the tokenizer filled to the 262,144-token vocabulary) and, given a
python with llama-cpp-python, ``...Q4_K_M.gguf`` from it by llama.cpp's own quantizer (its fallbacks too: widths
that are not multiples of 256 take q5_0 and q8_0, as in the published Q4_K_M files of these shapes). Then:

    .venv/bin/python benchmarks/compare_llamacpp.py --model OUT_DIR/gemma3-270m-random.Q4_K_M.gguf --rounds 3
    .venv/bin/python benchmarks/kernel_share.py --model OUT_DIR/gemma3-270m-random.Q4_K_M.gguf --quantization gguf

Random weights make the speed of a real file (the same tensors, types and shapes) but not its text: the two
programs' greedy tokens part early, their logits being nearly flat.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from frame.testing.gguf import write_gguf
from frame.weights import open_weights
from transformers import AutoModelForCausalLM, Gemma3TextConfig

#: Gemma 3's published text shapes (google/gemma-3-270m, google/gemma-3-1b-pt configs).
SHAPES = {
    "270m": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512),
    "1b": dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
               num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512),
}
ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}

QUANTIZE = """
import ctypes, sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.allow_requantize = True
params.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="270m")
    parser.add_argument("--llamacpp-python", help="a python with llama-cpp-python, to quantize to Q4_K_M")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    config = Gemma3TextConfig(vocab_size=262144, max_position_embeddings=32768, rope_parameters=ROPE,
                              tie_word_embeddings=True, architectures=["Gemma3ForCausalLM"], pad_token_id=0,
                              bos_token_id=1, eos_token_id=2, **shape)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):  # offsets from one, as trained Gemma norms are
                param.uniform_(-0.2, 0.2)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gemma3-{args.shape}-random"
    with tempfile.TemporaryDirectory(prefix="gemma3-") as folder:
        model.save_pretrained(folder)

        def keys(writer) -> None:  # what the converter's Gemma3Model writes beyond every model's
            writer.add_sliding_window(shape["sliding_window"])
            writer.add_rope_freq_base(ROPE["full_attention"]["rope_theta"])

        write_gguf(open_weights(Path(folder)), stem.with_suffix(".Q8_0.gguf"), "GEMMA3", shape["num_hidden_layers"],
                   lambda n, t: t + 1 if n.endswith("norm.weight") else t, config=config, file_type="q8_0",
                   metadata=keys, pad_vocab=True)
    written = [stem.with_suffix(".Q8_0.gguf")]
    if args.llamacpp_python:
        target = stem.with_suffix(".Q4_K_M.gguf")
        subprocess.run([args.llamacpp_python, "-c", QUANTIZE, str(written[0]), str(target)], check=True,
                       capture_output=True)
        written.append(target)
    print(json.dumps({"written": [str(p) for p in written]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
