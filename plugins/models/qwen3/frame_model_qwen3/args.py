"""QwenArgs: what a Qwen3, Qwen3-MoE or Qwen2-MoE network needs, read once from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass

from frame.layers.config import DecoderArgs, architecture_of
from pydantic import BaseModel
from transformers import PretrainedConfig

FAMILY = "qwen3"
#: Model type -> architecture, for configs that name only the type.
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


@dataclass(frozen=True)
class MoeArgs:
    """The sparse layers of a MoE checkpoint: which layers, how many experts, how routed."""

    layers: tuple[bool, ...]
    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    shared_intermediate_size: int = 0


@dataclass(frozen=True)
class QwenArgs(DecoderArgs):
    """The common sizes plus Qwen's biases, query/key norms, activation and experts."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = True
    hidden_act: str = "silu"
    moe: MoeArgs | None = None

    @classmethod
    def from_config(cls, config: PretrainedConfig, options: BaseModel | None = None) -> QwenArgs:
        """Read ``config``; UnsupportedModelError naming the field for anything this family does not build."""
        arch = architecture_of(config, ARCHITECTURES, FAMILY)
        qwen3 = arch != "Qwen2MoeForCausalLM"
        bias = bool(getattr(config, "attention_bias", False))
        return cls(
            **DecoderArgs.read(config, arch, FAMILY, options),
            qkv_bias=bias if qwen3 else bool(getattr(config, "qkv_bias", True)), o_bias=bias and qwen3,
            qk_norm=qwen3, hidden_act=config.hidden_act,
            moe=None if arch == "Qwen3ForCausalLM" else _moe_args(config),
        )


def _moe_args(config: PretrainedConfig) -> MoeArgs:
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    step = getattr(config, "decoder_sparse_step", 1) or 1
    experts = config.num_experts
    return MoeArgs(
        layers=tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(config.num_hidden_layers)),
        num_experts=experts, top_k=config.num_experts_per_tok, intermediate_size=config.moe_intermediate_size,
        renormalize=bool(getattr(config, "norm_topk_prob", False)),
        shared_intermediate_size=getattr(config, "shared_expert_intermediate_size", 0) or 0,
    )
