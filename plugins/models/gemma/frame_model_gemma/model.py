"""GemmaModel: Gemma 1 (Llama's layer with Gemma's norm and GeGLU), Gemma 2 and Gemma 3 (norms around each
sub-block, alternating local and global attention, soft-caps, and for Gemma 3 query/key norms and a local rope).

Gemma's norms weight by ``1 + w`` in float32 (``frame.layers.UpcastRMSNorm`` with offset 1); the embedding is
scaled by ``sqrt(hidden)`` rounded to the model's dtype; Gemma 2 soft-caps attention scores (through the attention
backend) and the final logits. llama.cpp stores Gemma's norm weights with the one already added, so GGUF norms lose
it again on load.
"""

from __future__ import annotations

import torch
from frame.interfaces.attention import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    GroupedMetadata,
    layer_metadata,
)
from frame.layers import (
    DecoderLM,
    GatedMLP,
    PreNormDecoderLayer,
    RotaryEmbedding,
    SandwichDecoderLayer,
    SelfAttention,
    UpcastRMSNorm,
)
from frame.layers.attention import KVCache
from frame.weights.loading import Placement
from frame.weights.names import NameMap
from torch import nn

from frame_model_gemma.args import GemmaArgs

HF_SANDWICH = {"pre_feedforward_layernorm": ("pre_ff_norm", None),
               "post_feedforward_layernorm": ("post_ff_norm", None)}
GGUF_SANDWICH = {"post_attention_norm": ("post_attn_norm", None), "ffn_norm": ("pre_ff_norm", None),
                 "post_ffw_norm": ("post_ff_norm", None)}


class GemmaModel(DecoderLM):
    """Scaled embedding, Gemma decoder layers, final norm and the (usually tied) output projection."""

    def __init__(self, args: GemmaArgs, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 layer_attention: list[AttentionBackend] | None = None) -> None:
        super().__init__(args.attention_specs(), attention, layer_attention, args.architecture,
                         final_logit_softcap=args.final_softcap)
        self.args = args
        extra = (HF_SANDWICH, GGUF_SANDWICH) if args.sandwich else ({}, {})
        self.names = {False: NameMap.hf(args.num_layers, self.what, layer=extra[0]),
                      True: NameMap.gguf(args.num_layers, self.what, layer=extra[1])}
        self.add_embeddings(args.vocab_size, args.hidden_size, args.tie_word_embeddings, device, dtype)
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)
        self.rotary_local = None if args.local_rope is None else RotaryEmbedding(
            args.local_rope, args.head_dim, args.max_position_embeddings, device)
        self.layers = nn.ModuleList(self._layer(spec, backend, device, dtype)
                                    for spec, backend in zip(self.specs, self.backends, strict=True))
        self.norm = self._norm(device, dtype)

    def _norm(self, device: torch.device, dtype: torch.dtype) -> UpcastRMSNorm:
        return UpcastRMSNorm(self.args.hidden_size, self.args.norm_eps, device, dtype, offset=1.0)

    def _layer(self, spec: AttentionSpec, backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype) -> nn.Module:
        args = self.args
        qk_norm = {"per_head": True, "upcast": True, "offset": 1.0} if args.qk_norm else None
        attn = SelfAttention(args.hidden_size, spec, backend, device, dtype, qk_norm=qk_norm, norm_eps=args.norm_eps)
        mlp = GatedMLP(args.hidden_size, args.intermediate_size, args.hidden_act, False, device, dtype,
                       field="hidden_activation")
        if not args.sandwich:
            return PreNormDecoderLayer(self._norm(device, dtype), attn, self._norm(device, dtype), mlp)
        return SandwichDecoderLayer(attn, self._norm(device, dtype), mlp, self._norm(device, dtype),
                                    input_norm=self._norm(device, dtype), pre_ff_norm=self._norm(device, dtype))

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        return h * torch.tensor(self.args.hidden_size**0.5, dtype=h.dtype)

    @torch.inference_mode()
    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
        meta: AttentionMetadata | GroupedMetadata,
    ) -> torch.Tensor:
        """Final-norm hidden states of the flat batch; Gemma 3's local layers rotate with their own rope."""
        if self.rotary_local is None:
            return super().forward(input_ids, positions, kv_caches, meta)
        caches = self.layer_caches(kv_caches)
        h = self.embed(input_ids, positions)
        ropes = (self.rotary.lookup(positions, h.dtype), self.rotary_local.lookup(positions, h.dtype))
        for layer, cache, local, index in zip(self.layers, caches, self.args.local_layers, self.cache_of_layer,
                                              strict=True):
            h, _ = layer(h, None, ropes[local], cache, layer_metadata(meta, index))
        return self.norm(h)[0]

    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Hugging Face or llama.cpp names; GGUF norm weights back to offsets from one."""
        if gguf and name.endswith("norm.weight"):
            tensor = tensor - 1.0
        return self.names[gguf].place(name, tensor)
