"""Where each checkpoint tensor goes: Hugging Face and llama.cpp GGUF names mapped to this family's layers.

The names are ``frame.weights.names``' Llama tables. llama.cpp's converter interleaves the rows of each Q and K
head of Llama and Mistral for its own rotary layout; :func:`unpermute_rows` restores the Hugging Face order.
"""

from __future__ import annotations

import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights.names import NameMap
from frame.weights.reordered import ReorderedRows

from frame_model_llama.args import LlamaArgs

#: Mixtral's sparse MLP (``frame.layers.MixtureOfExperts`` in ``mlp``): router and experts.
HF_MIXTRAL = {"block_sparse_moe.gate": ("mlp.router.gate", None)}
HF_MIXTRAL_EXPERTS = {r"block_sparse_moe\.experts\.(\d+)\.w1": ("mlp.experts", r"\1.gate"),
                      r"block_sparse_moe\.experts\.(\d+)\.w3": ("mlp.experts", r"\1.up"),
                      r"block_sparse_moe\.experts\.(\d+)\.w2": ("mlp.experts", r"\1.down")}
GGUF_MIXTRAL = {"ffn_gate_inp": ("mlp.router.gate", None), "ffn_gate_exps": ("mlp.experts", "*.gate"),
                "ffn_up_exps": ("mlp.experts", "*.up"), "ffn_down_exps": ("mlp.experts", "*.down")}


def name_map(args: LlamaArgs, gguf: bool) -> NameMap:
    """The names of ``args``' checkpoint in one format."""
    if args.experts is None:
        return (NameMap.gguf if gguf else NameMap.hf)(args.num_layers, args.architecture)
    if gguf:
        return NameMap.gguf(args.num_layers, args.architecture, layer=GGUF_MIXTRAL)
    return NameMap.hf(args.num_layers, args.architecture, layer=HF_MIXTRAL, patterns=HF_MIXTRAL_EXPERTS)


def unpermute_rows(tensor: torch.Tensor | PackedWeight, heads: int) -> torch.Tensor | PackedWeight:
    """Undo llama.cpp's per-head interleaving of Q/K rows (``[a0, b0, a1, b1, ...]`` back to ``[a..., b...]``). A
    packed weight (rows of blocks) is reordered the same way, lazily: the file's rows stay in place and a copy in
    this order is made only while a kernel is built or the reference reads it (``ReorderedRows``)."""
    rows = tensor.shape[0]
    order = torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)
    return ReorderedRows(tensor, order) if isinstance(tensor, PackedWeight) else tensor[order]


def gguf_heads_to_unpermute(name: str, args: LlamaArgs) -> int | None:
    """Head count to unpermute GGUF tensor ``name`` by, or None when it is stored in Hugging Face order."""
    if not args.gguf_qk_permuted:
        return None
    if ".attn_q." in name:
        return args.num_heads
    if ".attn_k." in name:
        return args.num_kv_heads
    return None
