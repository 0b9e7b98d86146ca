"""A GPT-2-style model family written outside the tree, as a third party would: only the core's public API (no
``frame.engine``, no in-tree plugin), its own hook functions and its own ``CausalLM``, built from ``frame.layers``.

It states its own attention (heads, scale, no rotary), uses the shared LayerNorm, GELU MLP, learned positions and
self-attention over paged KV, maps GPT-2's Conv1D checkpoint tensors itself, and passes the model conformance suite
against transformers' GPT2LMHeadModel with nothing of the suite overridden but the tiny config's spelling, the
name of a stranger tensor and where to find the plugin (it is registered in-process, not installed).
"""

from __future__ import annotations

import torch
from frame import hookimpl
from frame.interfaces.attention import AttentionBackend, AttentionMetadata, AttentionSpec
from frame.interfaces.model import CausalLM, KVCacheSpec, WeightSource
from frame.layers import (
    MLP,
    Embedding,
    LayerNorm,
    ParallelLMHead,
    SelfAttention,
    VocabParallelEmbedding,
    check_common,
    kv_cache_spec,
    layer_backends,
)
from frame.plugins.registry import PluginRegistry
from frame.testing.model import ModelFamilySuite
from frame.testing.registration import plugin_module
from frame.weights.loading import load_checkpoint
from torch import nn
from transformers import GPT2Config, PretrainedConfig

CONV1D = ("c_attn", "c_proj", "c_fc")


def specs_of(config: PretrainedConfig) -> list[AttentionSpec]:
    head_dim = config.n_embd // config.n_head
    return [AttentionSpec(config.n_head, config.n_head, head_dim, head_dim**-0.5)] * config.n_layer


class Block(nn.Module):
    def __init__(self, config: PretrainedConfig, spec: AttentionSpec, backend: AttentionBackend,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = config.n_embd, config.layer_norm_epsilon
        self.ln_1, self.ln_2 = LayerNorm(hidden, eps, device, dtype), LayerNorm(hidden, eps, device, dtype)
        self.attn = SelfAttention(hidden, spec, backend, device, dtype, qkv_bias=True, o_bias=True, rotary_dim=0)
        self.mlp = MLP(hidden, 4 * hidden, config.activation_function, True, device, dtype)

    def forward(self, h: torch.Tensor, cache, meta: AttentionMetadata) -> torch.Tensor:
        h = h + self.attn(self.ln_1(h)[0], None, cache, meta)
        return h + self.mlp(self.ln_2(h)[0])


class TinyGPT(CausalLM):
    """GPT-2: token plus learned position embeddings, pre-LayerNorm blocks, tied output projection."""

    def __init__(self, config: PretrainedConfig, layers: list[AttentionBackend], device: torch.device,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.specs = specs_of(config)
        self.hidden = config.n_embd
        self.wte = VocabParallelEmbedding(config.vocab_size, config.n_embd, device, dtype)
        self.wpe = Embedding(config.n_positions, config.n_embd, device, dtype)
        self.h = nn.ModuleList(Block(config, spec, backend, device, dtype)
                               for spec, backend in zip(self.specs, layers, strict=True))
        self.ln_f = LayerNorm(config.n_embd, config.layer_norm_epsilon, device, dtype)
        self.lm_head = ParallelLMHead(config.n_embd, config.vocab_size, device, dtype, weight=self.wte.weight)

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return kv_cache_spec(self.specs)

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta):  # type: ignore[override]
        h = self.wte(input_ids) + self.wpe(positions)
        for block, cache in zip(self.h, kv_caches, strict=True):
            h = block(h, cache, meta)
        return self.ln_f(h)[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def place(self, name: str, tensor: torch.Tensor):
        """GPT-2's names to this model's modules; Conv1D weights transposed, c_attn cut into Q, K and V."""
        if name.endswith((".attn.bias", ".attn.masked_bias")):  # causal-mask buffers of old checkpoints
            return None
        path, kind = name.removeprefix("transformer.").rsplit(".", 1)
        if path == "lm_head":
            return None  # tied to wte
        if path.split(".")[-1] in CONV1D and kind == "weight":
            tensor = tensor.t()
        path = path.replace("attn.c_attn", "attn.qkv").replace("attn.c_proj", "attn.o_proj")
        path = path.replace("mlp.c_fc", "mlp.up").replace("mlp.c_proj", "mlp.down_proj")
        if path.endswith("attn.qkv"):
            return [((path, kind, part), piece) for part, piece in zip("qkv", tensor.split(self.hidden), strict=True)]
        return [((path, kind, None), tensor)]

    def load_weights(self, source: WeightSource) -> None:
        load_checkpoint(self, source, self.place, "TinyGPT")


@hookimpl
def frame_model_architectures() -> list[str]:
    return ["GPT2LMHeadModel"]


@hookimpl
def frame_model_attention(hf_config: PretrainedConfig) -> list[AttentionSpec]:
    check_common(hf_config, "gpt2_style")  # refuses a quantization_config it cannot load, in one sentence
    return specs_of(hf_config)


@hookimpl
def frame_model_create(hf_config, dtype, device, attention, layer_attention) -> CausalLM:
    check_common(hf_config, "gpt2_style")
    return TinyGPT(hf_config, layer_backends(specs_of(hf_config), attention, layer_attention), device, dtype)


FAMILY = plugin_module("gpt2_style", frame_model_architectures=frame_model_architectures,
                       frame_model_attention=frame_model_attention, frame_model_create=frame_model_create)


class TestThirdPartyGPT2StyleFamily(ModelFamilySuite):
    plugin_name = "gpt2_style"
    surprise_tensor = "transformer.h.0.surprise.weight"

    def registry(self) -> PluginRegistry:
        registry = PluginRegistry()
        registry.register("model", "gpt2_style", FAMILY)
        return registry

    def tiny_config(self, architecture: str, **overrides) -> PretrainedConfig:
        return GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=97, bos_token_id=1,
                          eos_token_id=2, **overrides)
