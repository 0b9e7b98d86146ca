"""Phi3Model: Llama's layer with fused Q/K/V and gate/up checkpoint tensors, partial rotary and LongRoPE.

Phi-3 stores ``qkv_proj`` and ``gate_up_proj`` fused (llama.cpp: ``attn_qkv``, and ``ffn_up`` holding gate and up);
loading cuts them into the parts of ``frame.layers``' fused layers, which then shard by heads and features as for
any other family. Rotary covers the first ``partial_rotary_factor`` of each head (Phi-4-mini) with any rope type
``frame.layers.rotary`` implements, ``longrope`` included. A ``sliding_window`` applies to every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.layers import (
    DecoderLM,
    GatedMLP,
    PreNormDecoderLayer,
    RMSNorm,
    RotaryEmbedding,
    SelfAttention,
)
from frame.layers.config import DecoderArgs, architecture_of
from frame.weights.loading import Placement
from frame.weights.names import NameMap, split_rows
from pydantic import BaseModel
from torch import nn
from transformers import PretrainedConfig

FAMILY = "phi3"
ARCHITECTURES = ["Phi3ForCausalLM"]
HF_FUSED = {"self_attn.qkv_proj": ("attn.qkv", "qkv"), "mlp.gate_up_proj": ("mlp.gate_up", "gate_up")}
GGUF_FUSED = {"attn_qkv": ("attn.qkv", "qkv"), "ffn_up": ("mlp.gate_up", "gate_up")}


@dataclass(frozen=True)
class Phi3Args(DecoderArgs):
    """The common sizes (rope with its partial factor and LongRoPE, windows) plus the activation."""

    hidden_act: str = "silu"

    @classmethod
    def from_config(cls, config: PretrainedConfig, options: BaseModel | None = None) -> Phi3Args:
        """Read ``config``; UnsupportedModelError naming the field for anything this family does not build."""
        arch = architecture_of(config, {"phi3": "Phi3ForCausalLM"}, FAMILY)
        return cls(**DecoderArgs.read(config, arch, FAMILY, options), hidden_act=config.hidden_act)


class Phi3Model(DecoderLM):
    """Embedding, pre-norm decoder layers, final norm and the output projection."""

    def __init__(self, args: Phi3Args, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 layer_attention: list[AttentionBackend] | None = None) -> None:
        super().__init__(args.attention_specs(), attention, layer_attention, "Phi3ForCausalLM")
        self.args = args
        self.names = {False: NameMap.hf(args.num_layers, self.what, layer=HF_FUSED),
                      True: NameMap.gguf(args.num_layers, self.what, layer=GGUF_FUSED)}
        q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.fused_parts = {"qkv": [("q", q), ("k", kv), ("v", kv)],
                            "gate_up": [("gate", args.intermediate_size), ("up", args.intermediate_size)]}
        self.add_embeddings(args.vocab_size, args.hidden_size, args.tie_word_embeddings, device, dtype)
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)
        self.layers = nn.ModuleList(self._layer(spec, backend, device, dtype)
                                    for spec, backend in zip(self.specs, self.backends, strict=True))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps, device, dtype)

    def _layer(self, spec: AttentionSpec, backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype) -> PreNormDecoderLayer:
        args = self.args
        return PreNormDecoderLayer(
            RMSNorm(args.hidden_size, args.norm_eps, device, dtype),
            SelfAttention(args.hidden_size, spec, backend, device, dtype, rotary_dim=self.rotary.rotary_dim),
            RMSNorm(args.hidden_size, args.norm_eps, device, dtype),
            GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act, False, device, dtype),
        )

    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Fused Q/K/V and gate/up tensors cut into their parts; the rest as named."""
        target = self.names[gguf].target(name)
        if target is None:
            return None
        path, kind, part = target
        if part in self.fused_parts:
            return [((path, kind, piece_name), piece) for piece_name, piece in
                    split_rows(tensor, self.fused_parts[part])]
        return [(target, tensor)]
