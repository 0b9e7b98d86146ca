"""Greedy generation on the bundled model with two attention backends on one GPU: the tokens must agree.

The Python fallback of scripts/gpu_check.sh's end-to-end step, through the offline API
(``frame.LLM(attn=..., platform=...)``). In float32 the greedy tokens of every prompt must be equal; in
16-bit dtypes rounding may legitimately flip a near-tie, so there the first divergence is reported, not failed.

    python scripts/gpu_generate_compare.py [--platform cuda] [--dtype float32] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import sys

import torch
from frame import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "Write a haiku about paged attention.",
    "List three prime numbers and explain why each is prime.",
    "def fibonacci(n):",
]


def generate(attn: str, platform: str, dtype: str, max_tokens: int) -> list[list[int]]:
    llm = LLM(attn=attn, platform=platform, dtype=dtype)
    results = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=max_tokens))
    return [list(r.outputs[0].token_ids) for r in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="rocm" if torch.version.hip else "cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--backends", default="sdpa,triton", help="reference,candidate")
    args = parser.parse_args()
    reference_name, candidate_name = args.backends.split(",")
    reference = generate(reference_name, args.platform, args.dtype, args.max_tokens)
    candidate = generate(candidate_name, args.platform, args.dtype, args.max_tokens)
    failed = False
    for prompt, ref, cand in zip(PROMPTS, reference, candidate, strict=True):
        if ref == cand:
            print(f"same {len(ref)} tokens   {prompt!r}")
            continue
        first = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b), min(len(ref), len(cand)))
        print(f"DIFFER at token {first}  {prompt!r}\n  {reference_name}: {ref}\n  {candidate_name}: {cand}")
        failed = failed or args.dtype == "float32"
    if failed:
        print(f"FAIL: {candidate_name} and {reference_name} disagree in float32 greedy decoding")
        return 1
    print(f"OK: {candidate_name} agrees with {reference_name} on {args.platform} in {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
