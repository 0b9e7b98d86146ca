"""Sliding-window layers keep only their window (issue 31, item 2).

A tiny random Gemma 3 (five sliding layers to one full one, as the real models have them) and a tiny random Mistral
(every layer sliding), both with a 64-token window, made at test time. A prompt of eight windows (512 tokens) plus
16 greedy tokens equals transformers in float32, through both prefix caches and both attention backends that run on
the CPU, and the blocks each sliding KV group holds, read from the cache's stats, stay within its window (plus the
step's chunk and the block being filled) while the full group holds every block. A second prompt that extends the
first reuses its prefix in every group.
"""

from __future__ import annotations

import random

import pytest
import torch
from frame import LLM, SamplingParams
from transformers import AutoModelForCausalLM, Gemma3TextConfig, MistralConfig

WINDOW = 64
BLOCK = 16
CHUNK = 16  # prompt tokens per step: a sliding group holds its window plus one step's chunk
PROMPT = 8 * WINDOW
NEW_TOKENS = 16
COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=2048, vocab_size=49152, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, sliding_window=WINDOW)
CONFIGS = {
    "gemma3": lambda: Gemma3TextConfig(**COMMON, num_hidden_layers=6, query_pre_attn_scalar=16,
                                       layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    "mistral": lambda: MistralConfig(**COMMON, num_hidden_layers=2),
}
#: The KV groups frame makes: Gemma 3's full layer, then its five sliding layers one per group; Mistral's one group.
GROUPS = {"gemma3": ["full"] + [f"window {WINDOW}"] * 5, "mistral": [f"window {WINDOW}"]}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory, smol_source):
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(CONFIGS[request.param]()).save_pretrained(folder, safe_serialization=True)
    smol_source.tokenizer.save_pretrained(folder)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return request.param, folder, reference


def greedy(reference, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        out = reference.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("attn", ["cpu_paged", "sdpa"])
@pytest.mark.parametrize("cache", ["hashchain", "radix"])
def test_a_long_prompt_keeps_only_the_window_of_sliding_layers(tiny, cache: str, attn: str) -> None:
    name, folder, reference = tiny
    rng = random.Random(0)
    prompt = [rng.randrange(3, 49152) for _ in range(PROMPT)]
    extended = prompt + [rng.randrange(3, 49152) for _ in range(8)]
    llm = LLM(model=str(folder), dtype="float32", cache=cache, attn=attn, block_size=BLOCK,
              max_num_batched_tokens=CHUNK, max_model_len=1024)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    try:
        for tokens in (prompt, extended):
            [out] = llm.generate([{"prompt_token_ids": tokens}], params)
            assert out.outputs[0].token_ids == greedy(reference, tokens)
        stats = llm.stats()
    finally:
        llm.engine.shutdown()
    assert stats.kv_groups == GROUPS[name]
    full_blocks = -(-(len(extended) + NEW_TOKENS) // BLOCK)
    bound = WINDOW // BLOCK + CHUNK // BLOCK + 2  # the window, the step's chunk, the block being filled
    for kind, peak in zip(stats.kv_groups, stats.peak_group_blocks_in_use, strict=True):
        if kind == "full":
            assert peak == full_blocks
        else:
            assert peak <= bound < full_blocks / 4, f"a sliding group held {peak} blocks"
    assert stats.group_blocks_in_use == [0] * len(GROUPS[name])
    # The extended prompt reused the first one's prefix in every group (hashchain whole blocks, radix tokens).
    assert stats.prefix_hit_tokens >= PROMPT // BLOCK * BLOCK - BLOCK
