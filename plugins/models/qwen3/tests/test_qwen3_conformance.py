"""The qwen3 family against transformers: Qwen3, Qwen3-MoE and Qwen2-MoE, with windows, dense layers among
sparse ones, and shared experts."""

from __future__ import annotations

import gguf
import pytest
from frame.testing.family_llamacpp import WIDE
from frame.testing.model import ModelFamilySuite
from transformers import PretrainedConfig

MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


class TestQwen3Family(ModelFamilySuite):
    plugin_name = "qwen3"

    def gguf_architecture(self, architecture: str) -> str | None:
        return {"Qwen3ForCausalLM": "QWEN3", "Qwen3MoeForCausalLM": "QWEN3MOE",
                "Qwen2MoeForCausalLM": "QWEN2MOE"}.get(architecture)

    def gguf_metadata(self, writer: gguf.GGUFWriter, config: PretrainedConfig) -> None:
        """The experts' widths; llama.cpp has no key for a window, dense layers among sparse ones, or Qwen3-MoE
        without renormalised top-k weights (it always renormalises them)."""
        if getattr(config, "use_sliding_window", False) or getattr(config, "mlp_only_layers", None):
            pytest.skip("llama.cpp's converter states no window and no dense layers for Qwen")
        if config.architectures[0] == "Qwen3MoeForCausalLM" and not config.norm_topk_prob:
            pytest.skip("llama.cpp always renormalises Qwen3-MoE's top-k weights")
        if getattr(config, "moe_intermediate_size", None):
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        if getattr(config, "shared_expert_intermediate_size", None):
            writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        extra = {"head_dim": 16} if architecture == "Qwen3ForCausalLM" else dict(MOE, head_dim=16)
        if architecture == "Qwen2MoeForCausalLM":
            extra["shared_expert_intermediate_size"] = 48
        return super().tiny_config(architecture, **{**extra, **overrides})

    def wide_config(self, architecture: str) -> PretrainedConfig:
        experts = {} if architecture == "Qwen3ForCausalLM" else {"moe_intermediate_size": 256}
        if architecture == "Qwen3MoeForCausalLM":
            experts["norm_topk_prob"] = True  # llama.cpp always renormalises Qwen3-MoE's top-k weights
        if architecture == "Qwen2MoeForCausalLM":
            experts["shared_expert_intermediate_size"] = 256
        return self.tiny_config(architecture, **{**WIDE, **experts})

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        return {
            "qwen3-tied-biases-window-4-on-layer-1": self.tiny_config(
                "Qwen3ForCausalLM", tie_word_embeddings=True, attention_bias=True, use_sliding_window=True,
                sliding_window=4, max_window_layers=1),
            "qwen3-moe-normalised": self.tiny_config("Qwen3MoeForCausalLM", norm_topk_prob=True),
            "qwen3-moe-normalised-dense-layer-0-window-6": self.tiny_config(
                "Qwen3MoeForCausalLM", norm_topk_prob=True, mlp_only_layers=[0], use_sliding_window=True,
                sliding_window=6),
        }
