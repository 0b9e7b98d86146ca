"""LlamaArgs: the numbers a Llama-family network needs, read once from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frame.interfaces.attention import AttentionSpec
from frame.layers.config import DecoderArgs, architecture_of
from pydantic import BaseModel
from transformers import PretrainedConfig

FAMILY = "llama"
#: Architectures this family builds, and whether llama.cpp permuted their GGUF Q/K rows for its rope layout.
ARCHITECTURES: dict[str, bool] = {
    "LlamaForCausalLM": True,
    "MistralForCausalLM": True,
    "Qwen2ForCausalLM": False,
    "GraniteForCausalLM": True,
    "MixtralForCausalLM": True,
}
#: GGUF-derived configs name only a model type.
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "granite": "GraniteForCausalLM", "mixtral": "MixtralForCausalLM"}


@dataclass(frozen=True)
class Experts:
    """Mixtral's sparse MLP: ``num_experts`` SwiGLU experts, ``top_k`` of them per token (weights renormalised)."""

    num_experts: int
    top_k: int


@dataclass(frozen=True)
class LlamaArgs(DecoderArgs):
    """A Llama, Mistral, Qwen2, Granite or Mixtral checkpoint: the common sizes, biases, Granite's multipliers and
    Mixtral's experts."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    attention_scale: float | None = None  # None: head_dim ** -0.5
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logit_scale: float = 1.0
    experts: Experts | None = None

    @property
    def gguf_qk_permuted(self) -> bool:
        """True when llama.cpp's converter interleaved this architecture's Q/K rows."""
        return ARCHITECTURES[self.architecture]

    @classmethod
    def from_config(cls, config: PretrainedConfig, options: BaseModel | None = None) -> LlamaArgs:
        """Read ``config``; UnsupportedModelError naming the field for anything this family does not build."""
        arch = architecture_of(config, _MODEL_TYPES, FAMILY)
        qwen = arch == "Qwen2ForCausalLM"
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            **DecoderArgs.read(config, arch, FAMILY, options),
            qkv_bias=qwen or attention_bias,
            o_bias=attention_bias and not qwen,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            **_granite(config, arch), **_mixtral(config, arch),
        )

    def attention_specs(self) -> list[AttentionSpec]:  # type: ignore[override]
        """The same heads on every layer, a sliding window where the config sets one (Mistral, Qwen2)."""
        return super().attention_specs(self.attention_scale)


def _granite(config: PretrainedConfig, arch: str) -> dict[str, Any]:
    """Granite's multipliers: attention scale, embedding and residual multipliers, logits divided by a scale."""
    if arch != "GraniteForCausalLM":
        return {}
    return {"attention_scale": float(config.attention_multiplier),
            "embedding_multiplier": float(config.embedding_multiplier),
            "residual_multiplier": float(config.residual_multiplier), "logit_scale": 1.0 / config.logits_scaling}


def _mixtral(config: PretrainedConfig, arch: str) -> dict[str, Any]:
    """Mixtral's experts (every layer is sparse)."""
    if arch != "MixtralForCausalLM":
        return {}
    return {"experts": Experts(config.num_local_experts, config.num_experts_per_tok)}
