"""The olmo2 family against transformers: post-norms and query/key norms across all heads."""

from __future__ import annotations

from frame.testing.model import ModelFamilySuite
from transformers import PretrainedConfig


class TestOlmo2Family(ModelFamilySuite):
    plugin_name = "olmo2"

    def gguf_architecture(self, architecture: str) -> str | None:
        return {"Olmo2ForCausalLM": "OLMO2"}.get(architecture)

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        return super().tiny_config(architecture, **{"pad_token_id": 0, "eos_token_id": 1, **overrides})

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        return {"olmo2-tied-biases-multi-query": self.tiny_config("Olmo2ForCausalLM", tie_word_embeddings=True,
                                                                  attention_bias=True, num_key_value_heads=1)}
