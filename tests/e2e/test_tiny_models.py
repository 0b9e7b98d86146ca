"""Every in-tree model family, on tiny random checkpoints made at test time: frame's greedy output equals
transformers' in float32, through both prefix caches, with chunked prefill and a mixed batch. GPT-NeoX and
Starcoder2, which no native family claims, run through the transformers fallback family.

Windowed configs have windows of 8 tokens, far shorter than the prompts (about 36 tokens), so a backend or family
that attends outside a window produces other tokens from the first generated one. A token budget of 16 per step
chunks every prompt and mixes one sequence's decodes with another's prefill chunks; a second round of prompts that
extend the first round's reuses cached prefixes (the test checks that it does).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from frame import LLM, SamplingParams
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPT2Config,
    GPTNeoXConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Starcoder2Config,
)

WINDOW = 8
NEW_TOKENS = 12
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, vocab_size=49152, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
HEAD16 = dict(COMMON, head_dim=16)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
LAYER_1_WINDOWED = dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)

CONFIGS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama": lambda: LlamaConfig(**COMMON, tie_word_embeddings=True,
                                 rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 128}),
    "mistral-window": lambda: MistralConfig(**COMMON, sliding_window=WINDOW),
    "qwen2-window": lambda: Qwen2Config(**COMMON, **LAYER_1_WINDOWED),
    "granite": lambda: GraniteConfig(**COMMON, embedding_multiplier=2.0, residual_multiplier=0.5,
                                     attention_multiplier=0.2, logits_scaling=2.0),
    "mixtral-window": lambda: MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2,
                                            sliding_window=WINDOW),
    "qwen3-window": lambda: Qwen3Config(**HEAD16, **LAYER_1_WINDOWED),
    "qwen3-moe-window": lambda: Qwen3MoeConfig(**HEAD16, **MOE, norm_topk_prob=True, use_sliding_window=True,
                                               sliding_window=WINDOW),
    "qwen2-moe": lambda: Qwen2MoeConfig(**COMMON, **MOE, shared_expert_intermediate_size=48),
    "phi3-window": lambda: Phi3Config(**COMMON, sliding_window=WINDOW),
    "olmo2": lambda: Olmo2Config(**COMMON),
    "gemma": lambda: GemmaConfig(**HEAD16),
    "gemma2-window-softcaps": lambda: Gemma2Config(**HEAD16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                                                   attn_logit_softcapping=5.0, final_logit_softcapping=10.0),
    "gemma3-window": lambda: Gemma3TextConfig(**HEAD16, sliding_window=WINDOW, query_pre_attn_scalar=24,
                                              layer_types=["sliding_attention", "full_attention"]),
    "gpt2": lambda: GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512, vocab_size=49152,
                               initializer_range=0.2, bos_token_id=1, eos_token_id=2),
    # No native family claims these two: the transformers fallback serves them.
    "fallback-gpt-neox": lambda: GPTNeoXConfig(**{k: v for k, v in COMMON.items() if k != "num_key_value_heads"}),
    "fallback-starcoder2-window": lambda: Starcoder2Config(**COMMON, sliding_window=WINDOW),
}


class Checkpoint:
    """A tiny random checkpoint on disk and transformers' greedy continuations of prompts, computed once each."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self._greedy: dict[tuple[int, ...], list[int]] = {}

    def greedy(self, prompt: list[int]) -> list[int]:
        """The argmax continuation with EOS a token like any other, as frame's ``ignore_eos`` generates it (no EOS
        for ``generate``; ``min_new_tokens`` would instead suppress EOS and choose another token)."""
        key = tuple(prompt)
        if key not in self._greedy:
            with torch.inference_mode():
                out = self.reference.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                              eos_token_id=None, pad_token_id=0)
            self._greedy[key] = out[0, len(prompt):].tolist()
        return self._greedy[key]


def make_checkpoint(config: PretrainedConfig, folder: Path, tokenizer) -> Checkpoint:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)  # any tokenizer of the right vocabulary size will do
    return Checkpoint(folder)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory, smol_source) -> Checkpoint:
    return make_checkpoint(CONFIGS[request.param](), tmp_path_factory.mktemp(request.param), smol_source.tokenizer)


def generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return [r.outputs[0].token_ids for r in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


@pytest.mark.parametrize("cache", ["hashchain", "radix"])
def test_greedy_equals_transformers(tiny: Checkpoint, cache: str, chat_prompts) -> None:
    first = chat_prompts[:3]
    second = [first[0] + first[1][5:20], first[2] + [11, 12, 13]]  # extend cached prompts mid-block
    llm = LLM(model=str(tiny.folder), dtype="float32", cache=cache, block_size=8, max_num_batched_tokens=16,
              max_model_len=256)
    try:
        for prompts in (first, second):
            assert generate(llm, prompts) == [tiny.greedy(p) for p in prompts]
        assert llm.stats().prefix_hit_tokens >= 32
    finally:
        llm.engine.shutdown()


def test_mistral_sliding_window_is_honoured(tmp_path, smol_source, chat_prompts) -> None:
    """The case that was silently wrong: a Mistral checkpoint with a window shorter than the prompt. frame now
    matches transformers; the same checkpoint served with the window switched off (``disable_sliding_window``,
    what frame used to do without saying) does not."""
    tiny = make_checkpoint(MistralConfig(**COMMON, sliding_window=WINDOW), tmp_path, smol_source.tokenizer)
    prompts = chat_prompts[3:5]
    expected = [tiny.greedy(p) for p in prompts]
    outputs = {}
    for disabled in (False, True):
        llm = LLM(model=str(tiny.folder), dtype="float32", max_model_len=256,
                  model_options={"disable_sliding_window": disabled})
        outputs[disabled] = generate(llm, prompts)
        llm.engine.shutdown()
    assert outputs[False] == expected
    assert outputs[True] != expected


def test_the_fallback_is_chosen_only_where_no_native_family_claims_and_says_so(tmp_path, smol_source, caplog) -> None:
    from frame.engine.selection import select_model_family
    from frame.plugins.hooks import PluginHooks
    from frame.plugins.registry import PluginRegistry

    hooks = PluginHooks(PluginRegistry())
    assert hooks.model_is_fallback("transformers") and "LlamaForCausalLM" in hooks.model_architectures("transformers")
    assert select_model_family(hooks, "LlamaForCausalLM") == "llama"
    with caplog.at_level("INFO", logger="frame.selection"):
        assert select_model_family(hooks, "GPTNeoXForCausalLM") == "transformers"
    assert "model family 'transformers' builds GPTNeoXForCausalLM as the fallback" in caplog.text
