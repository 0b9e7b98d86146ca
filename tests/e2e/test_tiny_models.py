"""Tiny random Llama, Mistral and Qwen2 checkpoints, made at test time: frame's greedy output equals transformers'."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from frame import LLM, SamplingParams
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, vocab_size=49152, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2)

CONFIGS = {
    "llama": lambda: LlamaConfig(**COMMON, tie_word_embeddings=True,
                                 rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 128}),
    "mistral": lambda: MistralConfig(**COMMON, tie_word_embeddings=False, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**COMMON, tie_word_embeddings=False),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny_checkpoint(request, tmp_path_factory, smol_source) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[request.param]())
    model.save_pretrained(folder, safe_serialization=True)
    smol_source.tokenizer.save_pretrained(folder)  # any tokenizer of the right vocabulary size will do
    return folder


def test_greedy_equals_transformers(tiny_checkpoint: Path, chat_prompts) -> None:
    reference = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    llm = LLM(model=str(tiny_checkpoint), dtype="float32")
    prompts = chat_prompts[:4]
    results = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for prompt, result in zip(prompts, results, strict=True):
        with torch.inference_mode():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                     pad_token_id=0)
        assert result.outputs[0].token_ids == out[0, len(prompt):].tolist()
