"""LlamaModel: the Llama / Mistral / Qwen2 decoder over paged KV, as a frame CausalLM."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.model import CausalLM, KVCacheSpec, WeightSource
from frame.layers import Linear, RMSNorm, empty_parameter
from torch import nn

from frame_model_llama.args import LlamaArgs
from frame_model_llama.layers import DecoderLayer
from frame_model_llama.loading import expected_targets, gguf_heads_to_unpermute, target_of, unpermute_rows
from frame_model_llama.rope import RotaryEmbedding


class LlamaModel(CausalLM):
    """Embedding, decoder layers, final norm and the (possibly tied) output projection."""

    def __init__(self, args: LlamaArgs, attention: AttentionBackend, device: torch.device, dtype: torch.dtype):
        super().__init__()
        if (attention.num_heads, attention.num_kv_heads, attention.head_dim) != (
            args.num_heads, args.num_kv_heads, args.head_dim
        ):
            raise ValueError(
                f"the attention backend was made for {attention.num_heads} heads / {attention.num_kv_heads} KV "
                f"heads of size {attention.head_dim}, but the model has {args.num_heads} / {args.num_kv_heads} "
                f"of size {args.head_dim}"
            )
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size, device=device, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(args, attention, device, dtype) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, device, dtype)
        # Tied checkpoints reuse the embedding as the output projection and have no lm_head parameter.
        self.lm_head = None if args.tie_word_embeddings else empty_parameter(
            args.vocab_size, args.hidden_size, device=device, dtype=dtype
        )
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)
        # The output projection as a Linear over the same parameter, so a platform's kernel serves it too;
        # registered last, so the parameter keeps its checkpoint name (embed_tokens.weight or lm_head).
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head
        self.logits = Linear(args.hidden_size, args.vocab_size, False, device, dtype, weight=weight)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.args.num_layers, self.args.num_kv_heads, self.args.head_dim)

    @torch.inference_mode()
    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Final-norm hidden states ``[num_tokens, hidden]`` of the flat batch; writes every layer's new KV."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"got KV caches for {len(kv_caches)} layers, the model has {len(self.layers)}")
        h = self.embed_tokens(input_ids)
        rope = self.rotary.lookup(positions, h.dtype)
        residual = None
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            h, residual = layer(h, residual, rope, cache, meta)
        return self.norm(h, residual)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[n, vocab]``."""
        return self.logits(hidden).float()

    @torch.inference_mode()
    def load_weights(self, source: WeightSource) -> None:
        """Copy every tensor of ``source`` into place (fused shards by row range); ValueError on a gap or extra."""
        gguf = source.format == "gguf"
        params = dict(self.named_parameters())
        expected = expected_targets(list(params), self.args)
        for name, tensor in source.tensors():
            target = target_of(name, self.args, gguf)
            if target is None:
                continue
            param_name, offset, rows = target
            heads = gguf_heads_to_unpermute(name, self.args) if gguf else None
            if heads is not None:
                tensor = unpermute_rows(tensor, heads)
            dest = params[param_name].data
            if rows is not None:
                dest = dest[offset : offset + rows]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(dest.shape)}")
            dest.copy_(tensor)
            expected.discard((param_name, offset))
        if expected:
            missing = ", ".join(sorted(f"{p}[{o}:]" if o else p for p, o in expected))
            raise ValueError(f"the checkpoint lacks tensors for: {missing}")
