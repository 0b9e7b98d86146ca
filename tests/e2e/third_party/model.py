"""Gpt2Model: the GPT-2 family over frame's paged attention (an author's fill-in of the skeleton).

GPT-2 is not Llama: learned positions instead of rotary, LayerNorm with biases, a fused QKV projection stored
transposed (Hugging Face's Conv1D), a tanh-approximated GELU MLP and, usually, tied embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.model import CausalLM, KVCacheSpec, WeightSource
from frame.layers import check_common
from torch import nn
from transformers import PretrainedConfig

#: Hugging Face stores these as Conv1D weights, ``[in, out]``: transposed for nn.Linear.
_CONV1D = (".c_attn.weight", ".c_proj.weight", ".c_fc.weight")
#: Causal-mask buffers that old GPT-2 checkpoints saved beside the weights.
_BUFFERS = (".attn.bias", ".attn.masked_bias")


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, backend: AttentionBackend) -> None:
        super().__init__()
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.heads, self.backend = heads, backend

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata):
        q, k, v = (t.reshape(x.shape[0], self.heads, -1) for t in self.c_attn(x).chunk(3, dim=-1))
        return self.c_proj(self.backend.forward(q, k, v, kv[0], kv[1], meta).reshape(x.shape))


class _Mlp(nn.Module):
    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(hidden, inner)
        self.c_proj = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden = config.n_embd
        self.ln_1 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.attn = _Attention(hidden, config.n_head, backend)
        self.ln_2 = nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.mlp = _Mlp(hidden, config.n_inner or 4 * hidden)

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata):
        x = x + self.attn(self.ln_1(x), kv, meta)
        return x + self.mlp(self.ln_2(x))


class Gpt2Model(CausalLM):
    """GPT-2 with the Hugging Face parameter names (less the ``transformer.`` prefix)."""

    def __init__(self, hf_config: PretrainedConfig, attention: AttentionBackend) -> None:
        super().__init__()
        check_common(hf_config, "gpt2")  # a quantization_config it cannot load is refused, not ignored
        self.config = hf_config
        self.wte = nn.Embedding(hf_config.vocab_size, hf_config.n_embd)
        self.wpe = nn.Embedding(hf_config.n_positions, hf_config.n_embd)
        self.h = nn.ModuleList(_Block(hf_config, attention) for _ in range(hf_config.n_layer))
        self.ln_f = nn.LayerNorm(hf_config.n_embd, eps=hf_config.layer_norm_epsilon)
        tied = getattr(hf_config, "tie_word_embeddings", True)
        self.lm_head = None if tied else nn.Linear(hf_config.n_embd, hf_config.vocab_size, bias=False)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.config.n_layer, self.config.n_head, self.config.n_embd // self.config.n_head)

    def load_weights(self, source: WeightSource) -> None:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in source.tensors():
            key = name.removeprefix("transformer.")
            if key.endswith(_BUFFERS):
                continue
            if key not in params:
                raise ValueError(f"the checkpoint holds {name}, which GPT-2 has no place for")
            with torch.no_grad():
                params[key].copy_(tensor.t() if key.endswith(_CONV1D) else tensor)
            loaded.add(key)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"the checkpoint lacks {', '.join(missing)}")

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(positions)
        for block, kv in zip(self.h, kv_caches, strict=True):
            x = block(x, kv, meta)
        return self.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return (hidden @ weight.t()).float()
