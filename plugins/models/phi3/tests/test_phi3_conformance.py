"""The phi3 family against transformers: fused weights, a window on every layer, partial rotary and LongRoPE."""

from __future__ import annotations

import gguf
import numpy as np
from frame.testing.model import ModelFamilySuite
from transformers import PretrainedConfig


class TestPhi3Family(ModelFamilySuite):
    plugin_name = "phi3"

    def gguf_architecture(self, architecture: str) -> str | None:
        return {"Phi3ForCausalLM": "PHI3"}.get(architecture)

    def gguf_metadata(self, writer: gguf.GGUFWriter, config: PretrainedConfig) -> None:
        """The rotary width, the window, and LongRoPE's factors as two tensors with its original context."""
        head_dim = config.hidden_size // config.num_attention_heads
        rope = config.rope_parameters
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        if config.sliding_window:
            writer.add_sliding_window(config.sliding_window)
        if rope.get("rope_type") == "longrope":
            original = config.original_max_position_embeddings
            scale = config.max_position_embeddings / original
            writer.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(original))))
            writer.add_rope_scaling_orig_ctx_len(original)
            writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
            writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        return super().tiny_config(architecture, **{"pad_token_id": 0, **overrides})

    def extra_configs(self) -> dict[str, PretrainedConfig]:
        # Phi-4-mini's shape: a quarter of each head unrotated, LongRoPE factors per rotated pair. The suite's
        # prompts stay below original_max_position_embeddings, where transformers uses the short factors too.
        rotated_pairs = 6  # 16 * 0.75 / 2
        longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                    "short_factor": [1.0 + 0.1 * i for i in range(rotated_pairs)],
                    "long_factor": [2.0 + 0.5 * i for i in range(rotated_pairs)],
                    "original_max_position_embeddings": 32}
        return {
            "phi3-window-5": self.tiny_config("Phi3ForCausalLM", sliding_window=5),
            "phi4-mini-longrope-partial-tied": self.tiny_config(
                "Phi3ForCausalLM", rope_parameters=longrope, original_max_position_embeddings=32,
                max_position_embeddings=128, tie_word_embeddings=True),
        }
