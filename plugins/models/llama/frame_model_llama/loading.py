"""Where each checkpoint tensor goes: Hugging Face and llama.cpp GGUF names mapped to this family's layers.

A target is ``(module path, kind, part)``: the layer whose ``load(kind, tensor, part)`` takes the whole tensor
(and keeps its own tensor-parallel slice), ``kind`` ``weight`` or ``bias``, and for fused layers the part: Q, K
and V of ``qkv``, gate and up of ``gate_up``. llama.cpp's converter interleaves the rows of each Q and K head for
its own rotary layout; :func:`unpermute_rows` restores the Hugging Face order.
"""

from __future__ import annotations

import re

import torch

from frame_model_llama.args import LlamaArgs

_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_GGUF_LAYER = re.compile(r"blk\.(\d+)\.(.+)\.(weight|bias)$")

_HF_PARTS = {
    "self_attn.q_proj": ("attn.qkv", "q"), "self_attn.k_proj": ("attn.qkv", "k"),
    "self_attn.v_proj": ("attn.qkv", "v"), "self_attn.o_proj": ("attn.o_proj", None),
    "mlp.gate_proj": ("mlp.gate_up", "gate"), "mlp.up_proj": ("mlp.gate_up", "up"),
    "mlp.down_proj": ("mlp.down_proj", None), "input_layernorm": ("input_norm", None),
    "post_attention_layernorm": ("post_attn_norm", None),
}
_GGUF_PARTS = {
    "attn_q": ("attn.qkv", "q"), "attn_k": ("attn.qkv", "k"), "attn_v": ("attn.qkv", "v"),
    "attn_output": ("attn.o_proj", None), "ffn_gate": ("mlp.gate_up", "gate"), "ffn_up": ("mlp.gate_up", "up"),
    "ffn_down": ("mlp.down_proj", None), "attn_norm": ("input_norm", None), "ffn_norm": ("post_attn_norm", None),
}
_HF_TOP = {"model.embed_tokens.weight": "embed_tokens", "model.norm.weight": "norm", "lm_head.weight": "logits"}
_GGUF_TOP = {"token_embd.weight": "embed_tokens", "output_norm.weight": "norm", "output.weight": "logits"}
#: Tensors some checkpoints carry that the network recomputes (rotary tables) and so skips.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|rope_freqs\.weight)$")

Target = tuple[str, str, str | None]


def target_of(name: str, args: LlamaArgs, gguf: bool) -> Target | None:
    """Where checkpoint tensor ``name`` goes; None for a tensor to skip; ValueError for an unknown one."""
    if _IGNORED.search(name):
        return None
    top = (_GGUF_TOP if gguf else _HF_TOP).get(name)
    if top is not None:
        if top == "logits" and args.tie_word_embeddings:
            return None  # tied: the output projection is the embedding
        return top, "weight", None
    match = (_GGUF_LAYER if gguf else _HF_LAYER).match(name)
    part = match and (_GGUF_PARTS if gguf else _HF_PARTS).get(match.group(2))
    if not match or not part or int(match.group(1)) >= args.num_layers:
        raise ValueError(f"checkpoint tensor {name!r} has no place in {args.architecture}")
    module, shard = part
    return f"layers.{match.group(1)}.{module}", match.group(3), shard


def unpermute_rows(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head interleaving of Q/K rows (``[a0, b0, a1, b1, ...]`` back to ``[a..., b...]``)."""
    rows = tensor.shape[0]
    # As a row order, so that a quantization plugin's packed weight (rows of blocks) is reordered the same way.
    order = torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)
    return tensor[order]


def gguf_heads_to_unpermute(name: str, args: LlamaArgs) -> int | None:
    """Head count to unpermute GGUF tensor ``name`` by, or None when it is stored in Hugging Face order."""
    if not args.gguf_qk_permuted:
        return None
    if ".attn_q." in name:
        return args.num_heads
    if ".attn_k." in name:
        return args.num_kv_heads
    return None
