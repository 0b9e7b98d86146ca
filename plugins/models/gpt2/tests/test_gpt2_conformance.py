"""The gpt2 family against transformers: learned positions, LayerNorm, GELU, Conv1D weights, per-layer scales."""

from __future__ import annotations

import gguf
import pytest
import torch
from frame.testing.model import ModelFamilySuite
from transformers import GPT2Config, PretrainedConfig


class TestGPT2Family(ModelFamilySuite):
    plugin_name = "gpt2"
    surprise_tensor = "transformer.h.0.surprise.weight"

    def gguf_architecture(self, architecture: str) -> str | None:
        return {"GPT2LMHeadModel": "GPT2"}.get(architecture)

    def gguf_convert(self, name: str, tensor: torch.Tensor, config: PretrainedConfig) -> torch.Tensor:
        """llama.cpp stores GPT-2's Conv1D weights as linear ones."""
        return tensor.t() if self.gguf_transposed(name) else tensor

    def gguf_transposed(self, name: str) -> bool:
        return name.endswith((".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"))

    def gguf_metadata(self, writer: gguf.GGUFWriter, config: PretrainedConfig) -> None:
        """The converter's GPT-2 states the MLP as four times the width and no layer scale or activation."""
        if config.scale_attn_by_inverse_layer_idx or config.activation_function != "gelu_new":
            pytest.skip("llama.cpp's GPT-2 has no key for a per-layer attention scale or another activation")
        writer.add_feed_forward_length(4 * config.n_embd)

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        sizes = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "vocab_size": 97, "bos_token_id": 1,
                 "eos_token_id": 2}
        return GPT2Config(architectures=[architecture], **{**sizes, **overrides})

    def wide_config(self, architecture: str) -> PretrainedConfig:
        return self.tiny_config(architecture, n_embd=256, n_head=4, n_positions=1024, vocab_size=96)

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        return {"gpt2-inverse-layer-scale-exact-gelu-untied": self.tiny_config(
            "GPT2LMHeadModel", scale_attn_by_inverse_layer_idx=True, activation_function="gelu",
            tie_word_embeddings=False, n_inner=80)}
