"""Layers model families build from: the matmuls, norms, activations and rotary that a platform may serve with its
own kernels, their tensor-parallel forms, and the blocks made of them.

- :mod:`frame.layers.basic`: :class:`Linear`, :class:`RMSNorm` (Llama's), :class:`SiluAndMul`, :class:`RotateHalves`,
  :class:`Embedding` (replicated: learned positions);
- :mod:`frame.layers.parallel`: :class:`QKVParallelLinear`, :class:`ColumnParallelLinear`,
  :class:`RowParallelLinear`, :class:`SwiGLUProjection`, :class:`VocabParallelEmbedding`, :class:`ParallelLMHead`;
- :mod:`frame.layers.norms`: :class:`LayerNorm`, :class:`UpcastRMSNorm` (OLMo 2, Gemma), :class:`HeadNorm` (QK-norm);
- :mod:`frame.layers.activation`: activations by their transformers names, :class:`ActAndMul` (GeGLU and others);
- :mod:`frame.layers.rotary`: :class:`RotaryEmbedding` with every scaling frame implements;
- :mod:`frame.layers.attention`: :class:`SelfAttention` over paged KV, checks of the per-layer backends;
- :mod:`frame.layers.mlp`: :class:`GatedMLP`, :class:`MLP`; :mod:`frame.layers.moe`: :class:`MixtureOfExperts`;
- :mod:`frame.layers.config`: reading a transformers config (windows, refusals) and :class:`FamilyOptions`;
- :mod:`frame.layers.decoder`: :class:`DecoderLM`, the part of a decoder-only ``CausalLM`` every family shares,
  and the layer shapes :class:`PreNormDecoderLayer` (Llama's) and :class:`SandwichDecoderLayer` (Gemma 2's).

Weights a quantization plugin keeps packed reach the same layers (:mod:`frame.layers.quantized`). After
loading, :func:`attach_platform_kernels` asks the platform for a faster kernel per :class:`KernelLayer`.
"""

from frame.layers.activation import ActAndMul, activation
from frame.layers.attention import SelfAttention, kv_cache_layout, kv_cache_spec, layer_backends
from frame.layers.basic import (
    Embedding,
    KernelLayer,
    LayerKernel,
    Linear,
    RMSNorm,
    RotateHalves,
    SiluAndMul,
    attach_platform_kernels,
    copy_checked,
    empty_parameter,
)
from frame.layers.config import FamilyOptions, check_common, head_layout, layer_windows, unsupported
from frame.layers.decoder import DecoderLM, PreNormDecoderLayer, SandwichDecoderLayer
from frame.layers.loading import finish_loading
from frame.layers.mlp import MLP, GatedMLP, GatedProjection
from frame.layers.moe import FusedExperts, MixtureOfExperts, Router
from frame.layers.norms import HeadNorm, LayerNorm, UpcastRMSNorm
from frame.layers.parallel import (
    ColumnParallelLinear,
    OutputPart,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    SwiGLUProjection,
    VocabParallelEmbedding,
    local_heads,
)
from frame.layers.quantized import packed_weight, weight_bytes
from frame.layers.rotary import RotaryEmbedding, rope_parameters

__all__ = [
    "MLP", "ActAndMul", "ColumnParallelLinear", "DecoderLM", "Embedding", "FamilyOptions", "FusedExperts", "GatedMLP",
    "GatedProjection", "HeadNorm", "KernelLayer", "LayerKernel", "LayerNorm", "Linear", "MixtureOfExperts",
    "OutputPart", "ParallelLMHead", "PreNormDecoderLayer", "QKVParallelLinear", "RMSNorm", "RotaryEmbedding",
    "RotateHalves", "Router", "RowParallelLinear", "SandwichDecoderLayer", "SelfAttention", "SiluAndMul",
    "SwiGLUProjection", "UpcastRMSNorm", "VocabParallelEmbedding", "activation", "attach_platform_kernels",
    "check_common", "copy_checked", "empty_parameter", "finish_loading", "head_layout", "kv_cache_layout",
    "kv_cache_spec", "layer_backends", "layer_windows", "local_heads", "packed_weight", "rope_parameters",
    "unsupported", "weight_bytes",
]
