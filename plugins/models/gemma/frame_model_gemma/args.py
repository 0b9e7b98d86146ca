"""GemmaArgs: what a Gemma, Gemma 2 or Gemma 3 (text) network needs, read once from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frame.interfaces.attention import AttentionSpec
from frame.layers import rope_parameters
from frame.layers.config import DecoderArgs, architecture_of
from pydantic import BaseModel
from transformers import PretrainedConfig

FAMILY = "gemma"
#: Model type -> architecture, for configs that name only the type.
ARCHITECTURES = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


@dataclass(frozen=True)
class GemmaArgs(DecoderArgs):
    """The common sizes plus Gemma's activation, attention scale, soft-caps, norm layout and per-layer rope.

    ``sandwich``: norms before and after attention and MLP (Gemma 2, 3); ``qk_norm``: per-head query/key norms
    (Gemma 3); ``local_rope``: the rope of sliding layers where it differs from the global one (Gemma 3), with
    ``local_layers`` marking them (by layer type, so that ``disable_sliding_window`` keeps their rope)."""

    hidden_act: str = "gelu_pytorch_tanh"
    attention_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sandwich: bool = False
    qk_norm: bool = False
    local_rope: dict[str, Any] | None = None
    local_layers: tuple[bool, ...] = ()

    @classmethod
    def from_config(cls, config: PretrainedConfig, options: BaseModel | None = None) -> GemmaArgs:
        """Read ``config``; UnsupportedModelError naming the field for anything this family does not build."""
        arch = architecture_of(config, ARCHITECTURES, FAMILY)
        common = DecoderArgs.read(config, arch, FAMILY, options)
        gemma1 = arch == "GemmaForCausalLM"
        gemma3 = arch == "Gemma3ForCausalLM"
        types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        scalar = common["head_dim"] if gemma1 else config.query_pre_attn_scalar
        if gemma3:
            common["rope"] = rope_parameters(config, "full_attention")
        return cls(
            **common, hidden_act=getattr(config, "hidden_activation", None) or config.hidden_act,
            attention_scale=scalar**-0.5,
            # transformers' Gemma 3 never applies attn_logit_softcapping (its checkpoints leave it null); neither do we.
            attn_softcap=None if gemma3 else getattr(config, "attn_logit_softcapping", None),
            final_softcap=getattr(config, "final_logit_softcapping", None),
            sandwich=not gemma1, qk_norm=gemma3,
            local_rope=rope_parameters(config, "sliding_attention") if gemma3 else None,
            local_layers=tuple(t == "sliding_attention" for t in types),
        )

    def attention_specs(self) -> list[AttentionSpec]:  # type: ignore[override]
        """``query_pre_attn_scalar ** -0.5`` (Gemma 2, 3), windows on local layers, the attention soft-cap."""
        return super().attention_specs(self.attention_scale, self.attn_softcap)
