"""Resident memory of a loaded GGUF against issue 30's bound: RSS after load <= file size + KV pool + 15%.

At bench time (never in tests) it writes a random-weight Llama-family checkpoint of about a billion parameters
(Llama 3.2 1B's shape: 16 layers of width 2048, an 8192-wide SwiGLU, 32 query and 8 KV heads, a tied embedding,
here over a 32,000-token vocabulary) to GGUF f16 with the converter-style writer the family conformance tests use
(``frame.testing.gguf``: gguf-py's tensor names, the converter's common keys, its Q/K row interleaving), streaming
tensor by tensor so the writer never holds the model. llama.cpp's own quantizer (``llama_model_quantize`` of
llama-cpp-python, run in its own interpreter) turns it into each preset. Each file is then loaded by frame in a
fresh process (``--quantization gguf``, a KV pool set by ``--kv-cache-memory``) that reports its RSS once the
engine is built and again after a short generation, and its peak.

    .venv/bin/python benchmarks/gguf_memory.py --presets Q4_K_M Q4_0 Q8_0 --dir /tmp/frame-gguf-memory

Files already in ``--dir`` are reused (``--fresh`` writes them again); ``compare_llamacpp.py --gguf`` runs on
them too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from frame.testing.gguf import llama_cpp_permute, stored, write_text_model_keys
from transformers import LlamaConfig

DEFAULT_PYTHON = "/work/llama-venv/bin/python"
VOCAB = 32000
BOUND = 1.15

QUANTIZE = """
import ctypes, sys
import llama_cpp
source, out, preset, threads = sys.argv[1:5]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + preset)
params.nthread = int(threads)
if llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params)) != 0:
    raise SystemExit("llama_model_quantize failed for " + preset)
"""

MEASURE = """
import json, os, sys
from frame import LLM, SamplingParams

def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}

path, kv_memory, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
llm = LLM(path, quantization="gguf", kv_cache_memory=kv_memory, max_model_len=2048,
          platform_options={"threads": threads})
loaded = rss()
engine = llm.engine
kv_bytes = engine.num_blocks * engine.executor.bytes_per_block
llm.generate([{"prompt_token_ids": list(range(3, 67))}], SamplingParams(temperature=0.0, max_tokens=16))
print(json.dumps({"loaded": loaded, "generated": rss(), "kv_bytes": kv_bytes}))
"""


def llama_1b_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rms_norm_eps=1e-5, tie_word_embeddings=True, architectures=["LlamaForCausalLM"])


def layout(config: LlamaConfig) -> list[tuple[str, tuple[int, ...], int]]:
    """``(llama.cpp name, shape, query heads to interleave for or 0)`` of every tensor, in file order."""
    width, head_dim = config.hidden_size, config.hidden_size // config.num_attention_heads
    kv_width, ff = config.num_key_value_heads * head_dim, config.intermediate_size
    tensors = [("token_embd.weight", (config.vocab_size, width), 0), ("output_norm.weight", (width,), 0)]
    for i in range(config.num_hidden_layers):
        tensors += [(f"blk.{i}.attn_norm.weight", (width,), 0),
                    (f"blk.{i}.attn_q.weight", (width, width), config.num_attention_heads),
                    (f"blk.{i}.attn_k.weight", (kv_width, width), config.num_key_value_heads),
                    (f"blk.{i}.attn_v.weight", (kv_width, width), 0),
                    (f"blk.{i}.attn_output.weight", (width, width), 0),
                    (f"blk.{i}.ffn_norm.weight", (width,), 0),
                    (f"blk.{i}.ffn_gate.weight", (ff, width), 0), (f"blk.{i}.ffn_up.weight", (ff, width), 0),
                    (f"blk.{i}.ffn_down.weight", (width, ff), 0)]
    return tensors


def random_tensor(shape: tuple[int, ...], heads: int, generator: torch.Generator) -> torch.Tensor:
    """Hugging Face's init (N(0, 0.02) matrices, norms at one), Q/K rows interleaved as the converter does."""
    if len(shape) == 1:
        return torch.ones(shape)
    tensor = torch.empty(shape).normal_(0.0, 0.02, generator=generator)
    return llama_cpp_permute(tensor, heads) if heads else tensor


def write_tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    """A byte-level BPE vocabulary of ``vocab_size`` tokens: the special tokens, then strings of one to three
    printable characters of GPT-2's byte alphabet (only one merge: random weights need no real tokenizer, but
    llama.cpp and frame each read the full table)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = [bytes_to_unicode()[b] for b in range(33, 127)]
    words = itertools.chain(alphabet, map("".join, itertools.product(alphabet, repeat=2)),
                            map("".join, itertools.product(alphabet, repeat=3)))
    tokens = ["<pad>", "<s>", "</s>", *itertools.islice(words, vocab_size - 3)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_token_merges([f"{alphabet[0]} {alphabet[1]}"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)


def write_f16(path: Path, config: LlamaConfig, seed: int) -> None:
    """The checkpoint as llama.cpp's converter writes ``--outtype f16``, one tensor in memory at a time."""
    writer = gguf.GGUFWriter(path, "llama")
    write_text_model_keys(writer, config, "f16")
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    write_tokenizer(writer, config.vocab_size)
    tensors = layout(config)
    for name, shape, _ in tensors:  # the table first: names, shapes and types
        dtype = np.float16 if len(shape) > 1 else np.float32
        writer.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    generator = torch.Generator().manual_seed(seed)
    for name, shape, heads in tensors:
        array, qtype = stored(name, random_tensor(shape, heads, generator), "f16")
        assert qtype is None and array.dtype == (np.float16 if len(shape) > 1 else np.float32)
        writer.write_tensor_data(array)
    writer.close()


def quantize(python: str, source: Path, out: Path, preset: str, threads: int) -> None:
    done = subprocess.run([python, "-c", QUANTIZE, str(source), str(out), preset, str(threads)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"quantizing {preset} failed: {done.stderr[-2000:]}")


def measure(path: Path, kv_memory: str, threads: int) -> dict:
    """RSS of a fresh frame process that loaded ``path`` (its last stdout line, JSON)."""
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path), kv_memory, str(threads)], capture_output=True,
                          text=True, env={**os.environ, "FRAME_LOG_LEVEL": "WARNING"})
    if done.returncode != 0:
        raise SystemExit(f"frame failed on {path.name}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["Q4_K_M", "Q4_0", "Q8_0"])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/frame-gguf-memory"))
    parser.add_argument("--llamacpp-python", default=DEFAULT_PYTHON)
    parser.add_argument("--kv-cache-memory", default="256MiB")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true", help="write and quantize the files again")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    config = llama_1b_config()
    source = args.dir / "llama-1b-random-f16.gguf"
    if args.fresh or not source.exists():
        print(f"writing {source} ...", file=sys.stderr)
        write_f16(source, config, args.seed)
    rows = []
    mib = 1 << 20
    print(f"{'preset':8} {'file MiB':>9} {'KV MiB':>7} {'bound MiB':>9} {'RSS MiB':>8} {'anon':>6} {'file-b':>6} "
          f"{'after gen':>9} {'peak':>7}  within")
    for preset in args.presets:
        out = args.dir / f"llama-1b-random-{preset}.gguf"
        if args.fresh or not out.exists():
            print(f"quantizing {preset} ...", file=sys.stderr)
            quantize(args.llamacpp_python, source, out, preset, args.threads)
        got = measure(out, args.kv_cache_memory, args.threads)
        size = out.stat().st_size
        bound = (size + got["kv_bytes"]) * BOUND
        rss = got["loaded"]["VmRSS"]
        row = {"preset": preset, "file_bytes": size, "kv_bytes": got["kv_bytes"], "bound_bytes": int(bound),
               "rss_loaded": got["loaded"], "rss_generated": got["generated"], "within": rss <= bound}
        rows.append(row)
        print(f"{preset:8} {size / mib:9.0f} {got['kv_bytes'] / mib:7.0f} {bound / mib:9.0f} {rss / mib:8.0f} "
              f"{got['loaded']['RssAnon'] / mib:6.0f} {got['loaded']['RssFile'] / mib:6.0f} "
              f"{got['generated']['VmRSS'] / mib:9.0f} {got['generated']['VmHWM'] / mib:7.0f}  "
              f"{'yes' if row['within'] else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
