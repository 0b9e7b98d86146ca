"""A fused layer whose checkpoint parts arrive packed, dense, or both (frame.layers.loading.finish_loading)."""

from __future__ import annotations

import torch
from frame.layers import QKVParallelLinear
from frame.layers.loading import finish_loading
from frame.layers.quantized import packed_weight
from frame.weights import GGMLWeight
from torch import nn


def _qkv() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    layer = QKVParallelLinear(64, 32, 2, 1, False, torch.device("cpu"), torch.float32)  # q 64 rows, k 32, v 32
    gen = torch.Generator().manual_seed(0)
    dense = {part: torch.randn(rows, 64, generator=gen) for part, rows in (("q", 64), ("k", 32), ("v", 32))}
    return nn.ModuleDict({"qkv": layer}), dense


def test_parts_of_one_format_join_into_one_packed_weight() -> None:
    model, dense = _qkv()
    for part, w in dense.items():
        model["qkv"].load("weight", GGMLWeight.quantized("q8_0", w), part)
    assert finish_loading(model, None) == 1
    packed = packed_weight(model["qkv"])
    assert packed is not None and packed.format == "q8_0" and packed.shape == (128, 64)


def test_a_part_that_arrived_dense_makes_the_fused_weight_dense() -> None:
    # A k-quant GGUF stores some tensors in formats no plugin keeps packed (q5_0 beside q4_K and q6_K): the fused
    # layer runs dense, every row as the checkpoint gave it.
    model, dense = _qkv()
    v = GGMLWeight.quantized("q8_0", dense["v"])
    model["qkv"].load("weight", dense["q"], "q")
    model["qkv"].load("weight", dense["k"], "k")
    model["qkv"].load("weight", v, "v")
    assert finish_loading(model, None) == 0
    assert packed_weight(model["qkv"]) is None
    expected = torch.cat([dense["q"], dense["k"], v.dequantize()])
    assert torch.equal(model["qkv"].weight.data, expected)
