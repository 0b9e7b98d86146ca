"""The gemma family against transformers: Gemma's norms and GeGLU, Gemma 2's soft-caps and alternating windows,
Gemma 3's query/key norms and local rope, with windows shorter than the suite's prompts."""

from __future__ import annotations

import torch
from frame.testing.model import ModelFamilySuite
from transformers import PretrainedConfig


class TestGemmaFamily(ModelFamilySuite):
    plugin_name = "gemma"

    def gguf_architecture(self, architecture: str) -> str | None:
        return {"GemmaForCausalLM": "GEMMA", "Gemma2ForCausalLM": "GEMMA2",
                "Gemma3ForCausalLM": "GEMMA3"}.get(architecture)

    def gguf_convert(self, name: str, tensor: torch.Tensor, config: PretrainedConfig) -> torch.Tensor:
        """llama.cpp stores Gemma's norm weights with the one added."""
        return tensor + 1 if name.endswith("norm.weight") else tensor

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        # Tied, as every Gemma is (and as llama.cpp, which has no separate output tensor for Gemma, requires).
        extra = {"head_dim": 16, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True}
        if architecture != "GemmaForCausalLM":
            # A short window on the local layers, and a pre-attention scalar other than head_dim.
            extra.update(sliding_window=5, query_pre_attn_scalar=24)
        if architecture == "Gemma2ForCausalLM":  # caps low enough to bend the tiny model's scores and logits
            extra.update(attn_logit_softcapping=1.5, final_logit_softcapping=3.0)
        return super().tiny_config(architecture, **{**extra, **overrides})

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        gemma3_rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}
        return {
            "gemma3-final-softcap-scaled-rope-untied": self.tiny_config(
                "Gemma3ForCausalLM", final_logit_softcapping=5.0,
                rope_parameters=gemma3_rope, tie_word_embeddings=False,
                layer_types=["sliding_attention", "full_attention"]),
        }
