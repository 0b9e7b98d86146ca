"""Where each checkpoint tensor goes: Hugging Face and llama.cpp GGUF names mapped to this family's parameters.

A target is ``(parameter name, row offset, rows)``: Q, K and V land in row ranges of the fused ``qkv``
projection, gate and up in the fused ``gate_up``. llama.cpp's converter interleaves the rows of each Q and K head
for its own rotary layout; :func:`unpermute_rows` restores the Hugging Face order.
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
_HF_TOP = {"model.embed_tokens.weight": "embed_tokens.weight", "model.norm.weight": "norm.weight",
           "lm_head.weight": "lm_head"}
_GGUF_TOP = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
             "output.weight": "lm_head"}
#: Tensors some checkpoints carry that the network recomputes (rotary tables) and so skips.
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|rope_freqs\.weight)$")

#: Fused parameters and the checkpoint shards stacked in them, in row order.
FUSED = {"attn.qkv": ("q", "k", "v"), "mlp.gate_up": ("gate", "up")}

Target = tuple[str, int, int | None]


def shard_rows(args: LlamaArgs) -> dict[str, tuple[int, int]]:
    """``shard -> (row offset, rows)`` inside its fused parameter."""
    q, kv, inter = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim, args.intermediate_size
    return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv), "gate": (0, inter), "up": (inter, inter)}


def expected_targets(param_names: list[str], args: LlamaArgs) -> set[tuple[str, int]]:
    """Every ``(parameter, row offset)`` a checkpoint must fill: one per fused shard, one per other parameter."""
    rows = shard_rows(args)
    expected: set[tuple[str, int]] = set()
    for name in param_names:
        fused = next((parts for key, parts in FUSED.items() if f".{key}." in name), ())
        expected.update((name, rows[part][0]) for part in fused)
        if not fused:
            expected.add((name, 0))
    return expected


def target_of(name: str, args: LlamaArgs, gguf: bool) -> Target | None:
    """Where checkpoint tensor ``name`` goes; None for a tensor to skip; ValueError for an unknown one."""
    if _IGNORED.search(name):
        return None
    top = (_GGUF_TOP if gguf else _HF_TOP).get(name)
    if top is not None:
        if top == "lm_head" and args.tie_word_embeddings:
            return None  # tied: the output projection is the embedding
        return top, 0, None
    match = (_GGUF_LAYER if gguf else _HF_LAYER).match(name)
    part = match and (_GGUF_PARTS if gguf else _HF_PARTS).get(match.group(2))
    if not match or not part or int(match.group(1)) >= args.num_layers:
        raise ValueError(f"checkpoint tensor {name!r} has no place in {args.architecture}")
    param, shard = part
    offset, rows = shard_rows(args)[shard] if shard else (0, None)
    return f"layers.{match.group(1)}.{param}.{match.group(3)}", offset, rows


def unpermute_rows(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head interleaving of Q/K rows (``[a0, b0, a1, b1, ...]`` back to ``[a..., b...]``)."""
    half = tensor.shape[0] // heads // 2
    rest = tensor.shape[1:]
    return tensor.reshape(heads, half, 2, *rest).transpose(1, 2).reshape(tensor.shape)


def gguf_heads_to_unpermute(name: str, args: LlamaArgs) -> int | None:
    """Head count to unpermute GGUF tensor ``name`` by, or None when it is stored in Hugging Face order."""
    if not args.gguf_qk_permuted:
        return None
    if ".attn_q." in name:
        return args.num_heads
    if ".attn_k." in name:
        return args.num_kv_heads
    return None
