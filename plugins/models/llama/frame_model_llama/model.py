"""LlamaModel: the Llama / Mistral / Qwen2 / Granite / Mixtral decoder over paged KV, as a frame CausalLM.

Everything is built from ``frame.layers``, so platform kernels serve it and tensor parallelism shards it: the QKV
projection by heads, the SwiGLU projection by intermediate features, and the output and down projections sum their
partial products over the ranks. The family holds no communication code of its own."""

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
from torch import nn

from frame_model_llama.args import LlamaArgs
from frame_model_llama.loading import gguf_heads_to_unpermute, name_map, unpermute_rows


class LlamaModel(DecoderLM):
    """Embedding, decoder layers, final norm and the (possibly tied) output projection.

    ``layer_attention[i]`` serves layer ``i`` (made from :meth:`LlamaArgs.attention_specs`); with only ``attention``
    every layer uses it, which must then fit every layer's spec (no window where the config has one)."""

    def __init__(self, args: LlamaArgs, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 layer_attention: list[AttentionBackend] | None = None) -> None:
        super().__init__(args.attention_specs(), attention, layer_attention, args.architecture,
                         logit_scale=args.logit_scale)
        self.args = args
        self.names = {gguf: name_map(args, gguf) for gguf in (False, True)}
        self.add_embeddings(args.vocab_size, args.hidden_size, args.tie_word_embeddings, device, dtype)
        self.layers = nn.ModuleList(self._layer(spec, backend, device, dtype)
                                    for spec, backend in zip(self.specs, self.backends, strict=True))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps, device, dtype)
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)

    def _layer(self, spec: AttentionSpec, backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype) -> PreNormDecoderLayer:
        args = self.args
        return PreNormDecoderLayer(
            RMSNorm(args.hidden_size, args.norm_eps, device, dtype),
            SelfAttention(args.hidden_size, spec, backend, device, dtype, qkv_bias=args.qkv_bias, o_bias=args.o_bias),
            RMSNorm(args.hidden_size, args.norm_eps, device, dtype),
            self._mlp(device, dtype),
            residual_scale=args.residual_multiplier,
        )

    def _mlp(self, device: torch.device, dtype: torch.dtype) -> nn.Module:
        args = self.args
        if args.experts is None:
            return GatedMLP(args.hidden_size, args.intermediate_size, "silu", args.mlp_bias, device, dtype)
        return MixtureOfExperts(args.hidden_size, args.intermediate_size, args.experts.num_experts,
                                args.experts.top_k, device, dtype)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        return h * self.args.embedding_multiplier if self.args.embedding_multiplier != 1.0 else h

    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Hugging Face or llama.cpp names; GGUF Q/K rows of Llama and Mistral back in Hugging Face order."""
        heads = gguf_heads_to_unpermute(name, self.args) if gguf else None
        return self.names[gguf].place(name, tensor if heads is None else unpermute_rows(tensor, heads))
