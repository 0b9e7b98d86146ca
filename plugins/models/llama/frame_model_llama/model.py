"""LlamaModel: the Llama / Mistral / Qwen2 decoder over paged KV, as a frame CausalLM."""

from __future__ import annotations

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.model import CausalLM, KVCacheSpec, WeightSource
from frame.layers import ParallelLMHead, RMSNorm, VocabParallelEmbedding, local_heads
from torch import nn

from frame_model_llama.args import LlamaArgs
from frame_model_llama.layers import DecoderLayer
from frame_model_llama.loading import gguf_heads_to_unpermute, target_of, unpermute_rows
from frame_model_llama.rope import RotaryEmbedding


class LlamaModel(CausalLM):
    """Embedding, decoder layers, final norm and the (possibly tied) output projection."""

    def __init__(self, args: LlamaArgs, attention: AttentionBackend, device: torch.device, dtype: torch.dtype):
        super().__init__()
        heads = local_heads(args.num_heads, args.num_kv_heads)  # this tensor-parallel rank's share
        if (attention.num_heads, attention.num_kv_heads, attention.head_dim) != (
            heads.q_count, heads.kv_count, args.head_dim
        ):
            raise ValueError(
                f"the attention backend was made for {attention.num_heads} heads / {attention.num_kv_heads} KV "
                f"heads of size {attention.head_dim}, but this rank of the model has {heads.q_count} / "
                f"{heads.kv_count} of size {args.head_dim}"
            )
        self.args = args
        self.num_kv_heads = heads.kv_count
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size, device, dtype)
        self.layers = nn.ModuleList(DecoderLayer(args, attention, device, dtype) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, device, dtype)
        self.rotary = RotaryEmbedding(args.rope, args.head_dim, args.max_position_embeddings, device)
        # Tied checkpoints reuse the embedding (the same vocabulary slice) as the output projection.
        tied = self.embed_tokens.weight if args.tie_word_embeddings else None
        self.logits = ParallelLMHead(args.hidden_size, args.vocab_size, device, dtype, weight=tied)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.args.num_layers, self.num_kv_heads, self.args.head_dim)

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

    def expected_targets(self) -> set[tuple[str, str, str | None]]:
        """Every ``(module, kind, part)`` a checkpoint must fill."""
        expected: set[tuple[str, str, str | None]] = set()
        for path, module in self.named_modules():
            load_parts = getattr(module, "load_parts", None)
            if load_parts is None or (path == "logits" and self.args.tie_word_embeddings):
                continue
            for kind in ("weight", "bias"):
                if getattr(module, kind, None) is not None or (kind == "bias" and getattr(module, "summed_bias", None)
                                                                is not None):
                    expected.update((path, kind, part) for part in load_parts())
        return expected

    @torch.inference_mode()
    def load_weights(self, source: WeightSource) -> None:
        """Hand every tensor of ``source`` to its layer (which keeps its slice); ValueError on a gap or extra."""
        gguf = source.format == "gguf"
        modules = dict(self.named_modules())
        expected = self.expected_targets()
        for name, tensor in source.tensors():
            target = target_of(name, self.args, gguf)
            if target is None:
                continue
            heads = gguf_heads_to_unpermute(name, self.args) if gguf else None
            if heads is not None:
                tensor = unpermute_rows(tensor, heads)
            path, kind, part = target
            try:
                modules[path].load(kind, tensor, part)
            except ValueError as err:
                raise ValueError(f"checkpoint tensor {name!r}: {err}") from None
            expected.discard(target)
        if expected:
            missing = ", ".join(sorted(f"{p}.{k}" + (f"[{part}]" if part else "") for p, k, part in expected))
            raise ValueError(f"the checkpoint lacks tensors for: {missing}")
