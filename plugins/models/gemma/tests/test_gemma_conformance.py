"""The gemma family against transformers: Gemma's norms and GeGLU, Gemma 2's soft-caps and alternating windows,
Gemma 3's query/key norms and local rope, with windows shorter than the suite's prompts."""

from __future__ import annotations

import gguf
import pytest
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

    def gguf_metadata(self, writer: gguf.GGUFWriter, config: PretrainedConfig) -> None:
        """Gemma 2's window and soft-caps, Gemma 3's window, final soft-cap and global rope. llama.cpp scales
        queries by head_dim (but for the 27B models), puts a window on every other layer of Gemma 2 and on five
        layers in six of Gemma 3, and rotates Gemma 3's local layers with base 10,000: a config that differs has
        no key to say so."""
        architecture = config.architectures[0]
        if architecture == "GemmaForCausalLM":
            return
        if config.query_pre_attn_scalar != config.head_dim:
            pytest.skip("llama.cpp's converter has no key for query_pre_attn_scalar other than head_dim")
        writer.add_sliding_window(config.sliding_window)
        if architecture == "Gemma2ForCausalLM":
            writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
            return
        rope = config.rope_parameters
        pattern = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                   for i in range(config.num_hidden_layers)]
        if config.layer_types != pattern or rope["sliding_attention"]["rope_theta"] != 10000.0:
            pytest.skip("llama.cpp's Gemma 3 has five local layers in six, with rope base 10,000")
        if config.final_logit_softcapping:
            writer.add_final_logit_softcapping(config.final_logit_softcapping)
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        if rope["full_attention"].get("rope_type") == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["full_attention"]["factor"])

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        # Tied, as every Gemma is (and as llama.cpp, which has no separate output tensor for Gemma, requires).
        extra = {"head_dim": 16, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, "tie_word_embeddings": True}
        if architecture != "GemmaForCausalLM":
            # A short window on the local layers, and a pre-attention scalar other than head_dim.
            extra.update(sliding_window=5, query_pre_attn_scalar=24)
        if architecture == "Gemma2ForCausalLM":  # caps low enough to bend the tiny model's scores and logits
            extra.update(attn_logit_softcapping=1.5, final_logit_softcapping=3.0)
        return super().tiny_config(architecture, **{**extra, **overrides})

    def wide_config(self, architecture: str) -> PretrainedConfig:
        config = super().wide_config(architecture)
        if architecture != "GemmaForCausalLM":  # the converter states no other scalar than head_dim
            config.query_pre_attn_scalar = config.head_dim
        return config

    def randomize_wide(self, model: torch.nn.Module, seed: int) -> None:
        """Gemma's norms scale by ``1 + weight``: weights about zero scale by about one."""
        super().randomize_wide(model, seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.sub_(1)

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        gemma3_rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}
        gguf_shaped = {"query_pre_attn_scalar": 16, "sliding_window": 4}
        return {
            # As llama.cpp's converter can state them: queries scaled by head_dim; Gemma 3 with its five local
            # layers to one global, the global rope base and linear scaling, and local base 10,000.
            "gemma2-gguf-shaped": self.tiny_config("Gemma2ForCausalLM", **gguf_shaped),
            "gemma3-gguf-shaped-6-layers-scaled-rope": self.tiny_config(
                "Gemma3ForCausalLM", num_hidden_layers=6, final_logit_softcapping=5.0, **gguf_shaped,
                rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
            "gemma3-final-softcap-scaled-rope-untied": self.tiny_config(
                "Gemma3ForCausalLM", final_logit_softcapping=5.0,
                rope_parameters=gemma3_rope, tie_word_embeddings=False,
                layer_types=["sliding_attention", "full_attention"]),
        }
