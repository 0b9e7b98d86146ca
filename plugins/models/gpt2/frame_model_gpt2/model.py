"""GPT2Model: GPT-2 over paged KV: learned positions, LayerNorm, GELU, and Conv1D checkpoint weights.

No rotary: positions are a learned table added to the token embeddings. Each layer is Llama's pre-norm shape with
LayerNorm and a biased ``c_fc -> gelu -> c_proj`` MLP. Hugging Face stores GPT-2's projections as ``Conv1D``
(``[in, out]``, the transpose of a linear weight) and Q/K/V fused in ``c_attn``; loading transposes and cuts them
into the parts of ``frame.layers``' tensor-parallel layers. llama.cpp's GGUF stores them already transposed.
``scale_attn_by_inverse_layer_idx`` gives each layer its own softmax scale through its attention spec.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.layers import MLP, DecoderLM, Embedding, LayerNorm, PreNormDecoderLayer, SelfAttention
from frame.layers.config import DecoderArgs, architecture_of
from frame.weights.loading import Placement
from frame.weights.names import NameMap, split_rows
from pydantic import BaseModel
from torch import nn
from transformers import PretrainedConfig

FAMILY = "gpt2"
ARCHITECTURES = ["GPT2LMHeadModel"]
_LAYER = {"ln_1": ("input_norm", None), "attn.c_attn": ("attn.qkv", "qkv"), "attn.c_proj": ("attn.o_proj", None),
          "ln_2": ("post_attn_norm", None), "mlp.c_fc": ("mlp.up", None), "mlp.c_proj": ("mlp.down_proj", None)}
_TOP = {"transformer.wte": "embed_tokens", "transformer.wpe": "positions", "transformer.ln_f": "norm",
        "lm_head": "lm_head"}
_GGUF_LAYER = {"attn_norm": ("input_norm", None), "attn_qkv": ("attn.qkv", "qkv"),
               "attn_output": ("attn.o_proj", None), "ffn_norm": ("post_attn_norm", None),
               "ffn_up": ("mlp.up", None), "ffn_down": ("mlp.down_proj", None)}
#: Hugging Face names of GPT-2's Conv1D weights, stored ``[in, out]``.
_CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


@dataclass(frozen=True)
class GPT2Args(DecoderArgs):
    """The common sizes plus GPT-2's activation and per-layer scale settings."""

    activation: str = "gelu_new"
    scale_weights: bool = True
    scale_by_layer: bool = False

    @classmethod
    def from_config(cls, config: PretrainedConfig, options: BaseModel | None = None) -> GPT2Args:
        """Read ``config``; UnsupportedModelError naming the field for anything this family does not build."""
        arch = architecture_of(config, {"gpt2": "GPT2LMHeadModel"}, FAMILY)
        common = DecoderArgs.read(config, arch, FAMILY, options, norm_eps="layer_norm_epsilon")
        common["intermediate_size"] = getattr(config, "n_inner", None) or 4 * config.hidden_size
        return cls(**common, activation=config.activation_function,
                   scale_weights=bool(getattr(config, "scale_attn_weights", True)),
                   scale_by_layer=bool(getattr(config, "scale_attn_by_inverse_layer_idx", False)))

    def attention_specs(self) -> list[AttentionSpec]:  # type: ignore[override]
        """``head_dim ** -0.5`` (or 1 without ``scale_attn_weights``), divided by the layer's number when
        ``scale_attn_by_inverse_layer_idx``."""
        base = self.head_dim**-0.5 if self.scale_weights else 1.0
        return [AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim,
                              base / (i + 1) if self.scale_by_layer else base) for i in range(self.num_layers)]


class GPT2Model(DecoderLM):
    """Token and position embeddings, pre-norm decoder layers, final LayerNorm and the tied output projection."""

    def __init__(self, args: GPT2Args, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 layer_attention: list[AttentionBackend] | None = None) -> None:
        super().__init__(args.attention_specs(), attention, layer_attention, args.architecture)
        self.args = args
        self.names = {False: NameMap(_TOP, _LAYER, r"transformer\.h\.(\d+)\.", args.num_layers, self.what),
                      True: NameMap.gguf(args.num_layers, self.what, {"position_embd": "positions"}, _GGUF_LAYER)}
        hidden = args.hidden_size
        self.fused_qkv = [("q", hidden), ("k", hidden), ("v", hidden)]
        self.add_embeddings(args.vocab_size, hidden, args.tie_word_embeddings, device, dtype)
        self.positions = Embedding(args.max_position_embeddings, hidden, device, dtype)
        self.rotary = None
        self.layers = nn.ModuleList(
            PreNormDecoderLayer(LayerNorm(hidden, args.norm_eps, device, dtype),
                                SelfAttention(hidden, spec, backend, device, dtype, qkv_bias=True, o_bias=True,
                                              rotary_dim=0),
                                LayerNorm(hidden, args.norm_eps, device, dtype),
                                MLP(hidden, args.intermediate_size, args.activation, True, device, dtype))
            for spec, backend in zip(self.specs, self.backends, strict=True))
        self.norm = LayerNorm(hidden, args.norm_eps, device, dtype)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) + self.positions(positions)

    def placements(self, name: str, tensor: torch.Tensor, gguf: bool) -> list[Placement] | None:
        """Conv1D weights transposed (Hugging Face only), fused Q/K/V weights and biases cut into their parts."""
        target = self.names[gguf].target(name)
        if target is None:
            return None
        if not gguf and name.endswith(_CONV1D):
            tensor = tensor.t()
        path, kind, part = target
        if part == "qkv":
            return [((path, kind, piece), rows) for piece, rows in split_rows(tensor, self.fused_qkv)]
        return [(target, tensor)]
