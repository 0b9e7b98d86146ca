"""The qwen3 family against transformers: Qwen3, Qwen3-MoE and Qwen2-MoE, with windows, dense layers among
sparse ones, and shared experts."""

from __future__ import annotations

from frame.testing.model import ModelFamilySuite
from transformers import PretrainedConfig

MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


class TestQwen3Family(ModelFamilySuite):
    plugin_name = "qwen3"

    def gguf_architecture(self, architecture: str) -> str | None:
        return {"Qwen3ForCausalLM": "QWEN3", "Qwen3MoeForCausalLM": "QWEN3MOE",
                "Qwen2MoeForCausalLM": "QWEN2MOE"}.get(architecture)

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        extra = {"head_dim": 16} if architecture == "Qwen3ForCausalLM" else dict(MOE, head_dim=16)
        if architecture == "Qwen2MoeForCausalLM":
            extra["shared_expert_intermediate_size"] = 48
        return super().tiny_config(architecture, **{**extra, **overrides})

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        return {
            "qwen3-tied-biases-window-4-on-layer-1": self.tiny_config(
                "Qwen3ForCausalLM", tie_word_embeddings=True, attention_bias=True, use_sliding_window=True,
                sliding_window=4, max_window_layers=1),
            "qwen3-moe-normalised-dense-layer-0-window-6": self.tiny_config(
                "Qwen3MoeForCausalLM", norm_topk_prob=True, mlp_only_layers=[0], use_sliding_window=True,
                sliding_window=6),
        }
