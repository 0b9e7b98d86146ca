"""The llama family against transformers: every architecture, plus the rope, layout and window variants it supports."""

from __future__ import annotations

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
