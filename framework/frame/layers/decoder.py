"""DecoderLM: the part of a decoder-only :class:`~frame.interfaces.model.CausalLM` that every family shares, and
:class:`PreNormDecoderLayer`, the Llama-style layer most families are made of.

:class:`DecoderLM` checks the backends the core made against the family's per-layer :class:`AttentionSpec` s, sizes
the KV pool from them (a layer that shares another's KV needs no cache), maps each layer to its cache, runs a stack of
pre-norm layers (:meth:`DecoderLM.forward`; families of another shape override it), computes logits through
``lm_head`` (with a final scale and soft-cap where the checkpoint asks for them) and loads weights through the
family's :meth:`DecoderLM.placements`. A family adds ``embed_tokens``, ``layers``, ``norm``, ``lm_head`` and
``rotary`` (or None), and writes ``placements``.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
from torch import nn

from frame.interfaces.attention import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    GroupedMetadata,
    layer_metadata,
)
from frame.interfaces.model import CausalLM, KVCacheSpec, WeightSource
from frame.layers.attention import KVCache, Rope, SelfAttention, kv_cache_layout, kv_cache_spec, layer_backends
from frame.layers.parallel import ParallelLMHead, VocabParallelEmbedding
from frame.weights.loading import Placement, load_checkpoint


class PreNormDecoderLayer(nn.Module):
    """``input_norm -> attn -> post_attn_norm -> mlp`` around a residual stream carried beside the hidden states
    (Llama, Mistral, Qwen, Mixtral, Phi-3, Granite, Gemma 1). The norms take ``(x, residual)`` and return
    ``(norm(x + residual), x + residual)``, so the next layer's input norm adds this layer's MLP output.

    ``residual_scale`` multiplies what each sub-block adds to the stream (Granite's ``residual_multiplier``).
    """

    def __init__(self, input_norm: nn.Module, attn: SelfAttention, post_attn_norm: nn.Module, mlp: nn.Module,
                 residual_scale: float = 1.0) -> None:
        super().__init__()
        self.input_norm, self.attn, self.post_attn_norm, self.mlp = input_norm, attn, post_attn_norm, mlp
        self.residual_scale = residual_scale

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope | None, cache: KVCache,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp output, residual)``; the next layer's norm adds the two."""
        h, residual = self.input_norm(x, residual)
        h = self.attn(h, rope, cache, meta)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        h, residual = self.post_attn_norm(h, residual)
        h = self.mlp(h)
        return (h * self.residual_scale if self.residual_scale != 1.0 else h), residual


class SandwichDecoderLayer(nn.Module):
    """Each sub-block's output normalised before it joins the residual stream: ``x + post_attn_norm(attn(
    input_norm(x)))``, then ``+ post_ff_norm(mlp(pre_ff_norm(.)))``. Gemma 2 and 3 have all four norms; OLMo 2 has
    no ``input_norm`` and ``pre_ff_norm`` (None). Returns ``(hidden, None)``: the stream is the hidden state."""

    def __init__(self, attn: SelfAttention, post_attn_norm: nn.Module, mlp: nn.Module, post_ff_norm: nn.Module,
                 input_norm: nn.Module | None = None, pre_ff_norm: nn.Module | None = None) -> None:
        super().__init__()
        self.input_norm, self.attn, self.post_attn_norm = input_norm, attn, post_attn_norm
        self.pre_ff_norm, self.mlp, self.post_ff_norm = pre_ff_norm, mlp, post_ff_norm

    def forward(self, x: torch.Tensor, residual: None, rope: Rope | None, cache: KVCache,
                meta: AttentionMetadata) -> tuple[torch.Tensor, None]:
        h = self.input_norm(x)[0] if self.input_norm is not None else x
        x = x + self.post_attn_norm(self.attn(h, rope, cache, meta))[0]
        h = self.pre_ff_norm(x)[0] if self.pre_ff_norm is not None else x
        return x + self.post_ff_norm(self.mlp(h))[0], None


class DecoderLM(CausalLM):
    """The shared part of a decoder-only model; ``what`` names it in errors (its architecture).

    ``logit_scale`` multiplies the logits (Granite's ``1 / logits_scaling``); ``final_logit_softcap`` ``c`` maps
    them to ``c * tanh(logits / c)`` (Gemma 2). Both are applied in float32.
    """

    def __init__(self, specs: list[AttentionSpec], attention: AttentionBackend,
                 layer_attention: list[AttentionBackend] | None, what: str, *, logit_scale: float = 1.0,
                 final_logit_softcap: float | None = None) -> None:
        super().__init__()
        self.specs = list(specs)
        self.what = what
        # Plain lists: backends are not modules, and layers reach theirs directly.
        self.backends = layer_backends(self.specs, attention, layer_attention)
        self.cache_of_layer = kv_cache_layout(self.specs)
        self._kv_spec = kv_cache_spec(self.specs)
        self.logit_scale = logit_scale
        self.final_logit_softcap = final_logit_softcap

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return self._kv_spec

    def layer_caches(self, kv_caches: list[KVCache]) -> list[KVCache]:
        """The cache each layer uses, from the runner's ``kv_caches`` (one per layer with its own KV)."""
        if len(kv_caches) != self._kv_spec.num_layers:
            raise ValueError(f"got KV caches for {len(kv_caches)} layers, the model has {self._kv_spec.num_layers}")
        return [kv_caches[i] for i in self.cache_of_layer]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[n, vocab]``."""
        logits = self.lm_head(hidden).float()
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.final_logit_softcap is not None:
            logits = torch.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap
        return logits

    def add_embeddings(self, vocab_size: int, hidden: int, tied: bool, device: torch.device,
                       dtype: torch.dtype) -> None:
        """``embed_tokens`` and ``lm_head``, vocabulary-parallel; a tied head reuses the embedding's weight (the
        same vocabulary slice on every rank)."""
        self.embed_tokens = VocabParallelEmbedding(vocab_size, hidden, device, dtype)
        self.lm_head = ParallelLMHead(hidden, vocab_size, device, dtype,
                                      weight=self.embed_tokens.weight if tied else None)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The hidden states the first layer receives (a family may scale them or add learned positions)."""
        return self.embed_tokens(input_ids)

    @torch.inference_mode()
    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
        meta: AttentionMetadata | GroupedMetadata,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[num_tokens, hidden]`` of the flat batch through a stack of
        :class:`PreNormDecoderLayer` s or :class:`SandwichDecoderLayer` s; writes every layer's new KV."""
        caches = self.layer_caches(kv_caches)
        h = self.embed(input_ids, positions)
        rope = self.rotary.lookup(positions, h.dtype) if self.rotary is not None else None
        residual = None
        for layer, cache, index in zip(self.layers, caches, self.cache_of_layer, strict=True):
            h, residual = layer(h, residual, rope, cache, layer_metadata(meta, index))
        return self.norm(h, residual)[0]

    @abstractmethod
    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Where checkpoint tensor ``name`` goes (llama.cpp names when ``gguf``): placements, or None to skip it;
        ValueError naming it when it has no place."""

    def load_weights(self, source: WeightSource) -> None:
        """Hand every tensor of ``source`` to its layer (which keeps its slice); ValueError on a gap or an extra."""
        gguf = source.format == "gguf"
        load_checkpoint(self, source, lambda name, tensor: self.placements(name, tensor, gguf), self.what)
