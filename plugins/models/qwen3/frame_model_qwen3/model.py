"""QwenModel: Qwen3 (Llama with per-head query/key norms), Qwen3-MoE and Qwen2-MoE (sparse MLPs) over paged KV.

Built from ``frame.layers`` only, so platform kernels serve it and ``--tensor-parallel-size`` shards it (experts
by their intermediate features)."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.layers import (
    DecoderLM,
    GatedMLP,
    MixtureOfExperts,
    PreNormDecoderLayer,
    RMSNorm,
    RotaryEmbedding,
    SelfAttention,
)
from frame.weights.loading import Placement
from frame.weights.names import NameMap
from torch import nn

from frame_model_qwen3.args import QwenArgs

#: The MoE block's names beyond a Llama layer's: router, experts, the shared expert and its gate.
HF_MOE = {
    "mlp.gate": ("mlp.router.gate", None), "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up", "gate"),
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up", "up"),
    "mlp.shared_expert.down_proj": ("mlp.shared_expert.down_proj", None),
    "mlp.shared_expert_gate": ("mlp.shared_expert_gate", None),
}
HF_EXPERTS = {r"mlp\.experts\.(\d+)\.(gate|up|down)_proj": ("mlp.experts", r"\1.\2")}
GGUF_MOE = {
    "ffn_gate_inp": ("mlp.router.gate", None), "ffn_gate_exps": ("mlp.experts", "*.gate"),
    "ffn_up_exps": ("mlp.experts", "*.up"), "ffn_down_exps": ("mlp.experts", "*.down"),
    "ffn_gate_shexp": ("mlp.shared_expert.gate_up", "gate"), "ffn_up_shexp": ("mlp.shared_expert.gate_up", "up"),
    "ffn_down_shexp": ("mlp.shared_expert.down_proj", None), "ffn_gate_inp_shexp": ("mlp.shared_expert_gate", None),
}


class QwenModel(DecoderLM):
    """Embedding, pre-norm decoder layers (dense or sparse MLPs), final norm, (possibly tied) output projection."""

    def __init__(self, args: QwenArgs, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 layer_attention: list[AttentionBackend] | None = None) -> None:
        super().__init__(args.attention_specs(), attention, layer_attention, args.architecture)
        self.args = args
        self.names = {False: NameMap.hf(args.num_layers, args.architecture, layer=HF_MOE, patterns=HF_EXPERTS),
                      True: NameMap.gguf(args.num_layers, args.architecture, layer=GGUF_MOE)}
        self.add_embeddings(args.vocab_size, args.hidden_size, args.tie_word_embeddings, device, dtype)
        self.layers = nn.ModuleList(self._layer(i, spec, backend, device, dtype)
                                    for i, (spec, backend) in enumerate(zip(self.specs, self.backends, strict=True)))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps, device, dtype)
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)

    def _layer(self, index: int, spec: AttentionSpec, backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype) -> PreNormDecoderLayer:
        args, moe = self.args, self.args.moe
        hidden = args.hidden_size
        if moe is not None and moe.layers[index]:
            mlp: nn.Module = MixtureOfExperts(
                hidden, moe.intermediate_size, moe.num_experts, moe.top_k, device, dtype, act=args.hidden_act,
                renormalize=moe.renormalize, shared_intermediate=moe.shared_intermediate_size,
                shared_gate=moe.shared_intermediate_size > 0)
        else:
            mlp = GatedMLP(hidden, args.intermediate_size, args.hidden_act, False, device, dtype)
        qk_norm = {"per_head": True} if args.qk_norm else None
        return PreNormDecoderLayer(
            RMSNorm(hidden, args.norm_eps, device, dtype),
            SelfAttention(hidden, spec, backend, device, dtype, qkv_bias=args.qkv_bias, o_bias=args.o_bias,
                          qk_norm=qk_norm, norm_eps=args.norm_eps),
            RMSNorm(hidden, args.norm_eps, device, dtype), mlp)

    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Hugging Face or llama.cpp names (llama.cpp keeps Qwen's Q/K rows in Hugging Face order). llama.cpp
        declares Qwen2-MoE's shared-expert gate a vector (``{n_embd}``), and its quantizer writes it so: it is the
        gate's one row."""
        if gguf and isinstance(tensor, torch.Tensor) and tensor.dim() == 1 and name.endswith("_inp_shexp.weight"):
            tensor = tensor.unsqueeze(0)
        return self.names[gguf].place(name, tensor)
