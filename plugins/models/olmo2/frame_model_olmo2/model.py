"""Olmo2Model: OLMo 2's decoder over paged KV: norms after attention and MLP, and query/key norms across heads.

Each sub-block's output is normalised before it joins the residual stream (``frame.layers.SandwichDecoderLayer``
without the pre-norms), every norm weighted in float32 (``frame.layers.UpcastRMSNorm``), and queries and keys are
RMS-normalised over all heads of their projection before rotary (``frame.layers.HeadNorm`` across heads, whose sum
of squares is summed over tensor-parallel ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.layers import DecoderLM, GatedMLP, RotaryEmbedding, SandwichDecoderLayer, SelfAttention, UpcastRMSNorm
from frame.layers.config import DecoderArgs, architecture_of
from frame.weights.loading import Placement
from frame.weights.names import NameMap
from pydantic import BaseModel
from torch import nn
from transformers import PretrainedConfig

FAMILY = "olmo2"
ARCHITECTURES = ["Olmo2ForCausalLM"]
HF_NORMS = {"post_feedforward_layernorm": ("post_ff_norm", None)}
GGUF_NORMS = {"post_attention_norm": ("post_attn_norm", None), "post_ffw_norm": ("post_ff_norm", None)}


@dataclass(frozen=True)
class Olmo2Args(DecoderArgs):
    """The common sizes plus the activation and the attention biases."""

    hidden_act: str = "silu"
    attention_bias: bool = False

    @classmethod
    def from_config(cls, config: PretrainedConfig, options: BaseModel | None = None) -> Olmo2Args:
        """Read ``config``; UnsupportedModelError naming the field for anything this family does not build."""
        arch = architecture_of(config, {"olmo2": "Olmo2ForCausalLM"}, FAMILY)
        return cls(**DecoderArgs.read(config, arch, FAMILY, options), hidden_act=config.hidden_act,
                   attention_bias=bool(getattr(config, "attention_bias", False)))


class Olmo2Model(DecoderLM):
    """Embedding, post-norm decoder layers, final norm and the output projection."""

    def __init__(self, args: Olmo2Args, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 layer_attention: list[AttentionBackend] | None = None) -> None:
        super().__init__(args.attention_specs(), attention, layer_attention, args.architecture)
        self.args = args
        self.names = {False: NameMap.hf(args.num_layers, self.what, layer=HF_NORMS),
                      True: NameMap.gguf(args.num_layers, self.what, layer=GGUF_NORMS)}
        self.add_embeddings(args.vocab_size, args.hidden_size, args.tie_word_embeddings, device, dtype)
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)
        self.layers = nn.ModuleList(self._layer(spec, backend, device, dtype)
                                    for spec, backend in zip(self.specs, self.backends, strict=True))
        self.norm = UpcastRMSNorm(args.hidden_size, args.norm_eps, device, dtype)

    def _layer(self, spec: AttentionSpec, backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype) -> SandwichDecoderLayer:
        args = self.args
        bias = args.attention_bias
        attn = SelfAttention(args.hidden_size, spec, backend, device, dtype, qkv_bias=bias, o_bias=bias,
                             qk_norm={"per_head": False, "upcast": True}, norm_eps=args.norm_eps)
        return SandwichDecoderLayer(
            attn, UpcastRMSNorm(args.hidden_size, args.norm_eps, device, dtype),
            GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act, False, device, dtype),
            UpcastRMSNorm(args.hidden_size, args.norm_eps, device, dtype))

    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Hugging Face or llama.cpp names (llama.cpp keeps OLMo 2's Q/K rows in Hugging Face order)."""
        return self.names[gguf].place(name, tensor)
