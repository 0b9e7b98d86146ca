"""The llama family against transformers: every architecture, plus the rope and layout variants it supports."""

from __future__ import annotations

from frame.testing.model import ModelFamilySuite
from transformers import PretrainedConfig


class TestLlamaFamily(ModelFamilySuite):
    plugin_name = "llama"

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
        }
