"""The transformers fallback against transformers itself, on architectures no native family claims: GPT-NeoX
(parallel residual, partial rotary), Starcoder2 (LayerNorm, biases, a window on every layer) and Phi (partial
rotary, a dense GELU MLP)."""

from __future__ import annotations

from frame.testing.model import TINY, ModelFamilySuite
from transformers import AutoConfig, PretrainedConfig

MODEL_TYPES = {"GPTNeoXForCausalLM": "gpt_neox", "Starcoder2ForCausalLM": "starcoder2", "PhiForCausalLM": "phi"}


class TestTransformersFallback(ModelFamilySuite):
    plugin_name = "transformers"

    def architectures(self) -> list[str]:
        return list(MODEL_TYPES)

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        sizes = dict(TINY, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        if architecture == "GPTNeoXForCausalLM":
            sizes.pop("num_key_value_heads")  # multi-head attention
        if architecture == "Starcoder2ForCausalLM":
            sizes["sliding_window"] = 6
        return AutoConfig.for_model(MODEL_TYPES[architecture], architectures=[architecture], **{**sizes, **overrides})
