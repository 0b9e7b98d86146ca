"""The llama family against transformers: every architecture, plus the rope, layout and window variants it supports."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
from frame.testing.gguf import llama_cpp_permute
from frame.testing.model import ModelFamilySuite
from transformers import PretrainedConfig


class TestLlamaFamily(ModelFamilySuite):
    plugin_name = "llama"

    def gguf_architecture(self, architecture: str) -> str | None:
        return {"LlamaForCausalLM": "LLAMA", "MistralForCausalLM": "LLAMA", "Qwen2ForCausalLM": "QWEN2",
                "GraniteForCausalLM": "GRANITE", "MixtralForCausalLM": "LLAMA"}.get(architecture)

    def gguf_convert(self, name: str, tensor: torch.Tensor, config: PretrainedConfig) -> torch.Tensor:
        """llama.cpp interleaves Llama-style Q/K rows (weights and biases) for its rotary; not Qwen2's."""
        if config.architectures[0] == "Qwen2ForCausalLM":
            return tensor
        if ".self_attn.q_proj." in name:
            return llama_cpp_permute(tensor, config.num_attention_heads)
        if ".self_attn.k_proj." in name:
            return llama_cpp_permute(tensor, config.num_key_value_heads)
        return tensor

    def gguf_metadata(self, writer: gguf.GGUFWriter, config: PretrainedConfig) -> None:
        """What the converter's Llama, Granite and Qwen2 classes write: the rotary width, the rope scaling (Llama 3's
        as a factor tensor) and Granite's multipliers. It states no sliding window for these architectures."""
        architecture = config.architectures[0]
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", False) or (window and architecture != "Qwen2ForCausalLM"
                                                             and window < config.max_position_embeddings):
            pytest.skip("llama.cpp's converter writes no sliding window for this architecture")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rope = config.rope_parameters
        kind = rope.get("rope_type", "default")
        if architecture != "Qwen2ForCausalLM":
            writer.add_rope_dimension_count(head_dim)
        if kind == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(rope["factor"])
        elif kind == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(rope["factor"])
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        elif kind == "llama3":
            writer.add_tensor("rope_freqs.weight", llama3_rope_factors(rope, head_dim))
        elif kind != "default":
            pytest.skip(f"llama.cpp runs no '{kind}' rope")
        if architecture == "GraniteForCausalLM":
            writer.add_embedding_scale(config.embedding_multiplier)
            writer.add_residual_scale(config.residual_multiplier)
            writer.add_attention_scale(config.attention_multiplier)
            writer.add_logit_scale(config.logits_scaling)

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        extra = {}
        if architecture == "MixtralForCausalLM":
            extra = {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32}
        elif architecture == "GraniteForCausalLM":  # multipliers far from one, so each must be applied
            extra = {"embedding_multiplier": 3.0, "residual_multiplier": 0.4, "attention_multiplier": 0.1,
                     "logits_scaling": 2.5}
        return super().tiny_config(architecture, **{**extra, **overrides})

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        llama = "LlamaForCausalLM"
        llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
        yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
        return {
            "llama-tied": self.tiny_config(llama, tie_word_embeddings=True),
            "llama-biases-head-dim-32": self.tiny_config(llama, attention_bias=True, mlp_bias=True, head_dim=32),
            "llama-multi-query": self.tiny_config(llama, num_key_value_heads=1),
            "llama-rope-linear": self.tiny_config(llama, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                          "rope_theta": 10000.0}),
            "llama-rope-dynamic": self.tiny_config(llama, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                           "rope_theta": 10000.0}),
            "llama-rope-llama3": self.tiny_config(llama, rope_parameters=llama3),
            "llama-rope-yarn": self.tiny_config(llama, rope_parameters=yarn),
            "qwen2-tied": self.tiny_config("Qwen2ForCausalLM", tie_word_embeddings=True),
            # Windows shorter than the suite's prompts: every layer (Mistral), the layers past max_window_layers
            # (Qwen2), each checked against transformers' own masks.
            "mistral-window-5": self.tiny_config("MistralForCausalLM", sliding_window=5),
            "qwen2-window-4-on-layer-1": self.tiny_config("Qwen2ForCausalLM", use_sliding_window=True,
                                                          sliding_window=4, max_window_layers=1),
            "mixtral-window-6": self.tiny_config("MixtralForCausalLM", sliding_window=6),
            "granite-tied-biases": self.tiny_config("GraniteForCausalLM", tie_word_embeddings=True,
                                                    attention_bias=True, mlp_bias=True),
        }


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """The factor tensor llama.cpp's converter writes for a Llama 3 rope (its ``generate_extra_tensors``)."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    original = rope["original_max_position_embeddings"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * math.pi * rope["rope_theta"] ** (i / head_dim)
        if wavelength < original / high:
            factors.append(1.0)
        elif wavelength > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)
