"""LlamaArgs: the numbers a Llama-family network needs, read once from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PretrainedConfig

#: Architectures this family builds, and whether llama.cpp permuted their GGUF Q/K rows for its rope layout.
ARCHITECTURES: dict[str, bool] = {
    "LlamaForCausalLM": True,
    "MistralForCausalLM": True,
    "Qwen2ForCausalLM": False,
}
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def architecture_of(config: PretrainedConfig) -> str:
    """The config's architecture; GGUF-derived configs name only a ``model_type``."""
    archs = getattr(config, "architectures", None) or []
    if archs:
        return archs[0]
    if config.model_type in _MODEL_TYPES:
        return _MODEL_TYPES[config.model_type]
    raise ValueError(f"config of model_type {config.model_type!r} names no architecture this family builds")


def rope_parameters(config: PretrainedConfig) -> dict[str, Any]:
    """The rope dict with ``rope_type`` and ``rope_theta``: ``rope_parameters`` (transformers 5) or the older
    ``rope_scaling`` plus ``rope_theta`` attributes."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


@dataclass(frozen=True)
class LlamaArgs:
    """Sizes, biases and rope settings of one Llama, Mistral or Qwen2 checkpoint."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    max_position_embeddings: int
    rope: dict[str, Any] = field(default_factory=dict)

    @property
    def gguf_qk_permuted(self) -> bool:
        """True when llama.cpp's converter interleaved this architecture's Q/K rows."""
        return ARCHITECTURES[self.architecture]

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> LlamaArgs:
        """Read ``config``; ValueError for an architecture or feature this family does not build."""
        arch = architecture_of(config)
        if arch not in ARCHITECTURES:
            raise ValueError(f"the llama model family builds {', '.join(ARCHITECTURES)}, not {arch}")
        if getattr(config, "use_sliding_window", False):
            raise ValueError(f"{arch} with use_sliding_window=True is not supported by the llama model family")
        qwen = arch == "Qwen2ForCausalLM"
        attention_bias = bool(getattr(config, "attention_bias", False))
        heads = config.num_attention_heads
        return cls(
            architecture=arch,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=qwen or attention_bias,
            o_bias=attention_bias and not qwen,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            max_position_embeddings=getattr(config, "max_position_embeddings", 4096),
            rope=rope_parameters(config),
        )
