"""A fused layer whose checkpoint parts arrive packed, dense, or both (frame.layers.loading.finish_loading)."""

from __future__ import annotations

import pytest
import torch
from frame.layers import QKVParallelLinear
from frame.layers.loading import finish_loading
from frame.layers.quantized import packed_weight
from frame.weights import GGMLWeight, MixedRows
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
    # A GGUF may store a part in a type no plugin keeps packed (iq2_xxs, or one left out of the gguf plugin's keep):
    # the fused layer runs dense, every row as the checkpoint gave it.
    model, dense = _qkv()
    v = GGMLWeight.quantized("q8_0", dense["v"])
    model["qkv"].load("weight", dense["q"], "q")
    model["qkv"].load("weight", dense["k"], "k")
    model["qkv"].load("weight", v, "v")
    assert finish_loading(model, None) == 0
    assert packed_weight(model["qkv"]) is None
    expected = torch.cat([dense["q"], dense["k"], v.dequantize()])
    assert torch.equal(model["qkv"].weight.data, expected)


def test_parts_in_different_formats_stay_packed_each_in_its_own() -> None:
    # llama.cpp's Q4_K_M stores some layers' V in q6_K beside q4_K Q and K: the fused layer keeps all three packed.
    model, dense = _qkv()
    parts = {"q": GGMLWeight.quantized("q5_0", dense["q"]), "k": GGMLWeight.quantized("q4_1", dense["k"]),
             "v": GGMLWeight.quantized("q8_0", dense["v"])}
    for part, w in parts.items():
        model["qkv"].load("weight", w, part)
    assert finish_loading(model, None) == 1
    packed = packed_weight(model["qkv"])
    assert isinstance(packed, MixedRows) and packed.format == "mixed" and packed.shape == (128, 64)
    assert [p.format for p in packed.parts] == ["q5_0", "q4_1", "q8_0"] and packed.offsets == [0, 64, 96, 128]
    reference = torch.cat([w.dequantize() for w in parts.values()])
    assert torch.equal(packed.dequantize(), reference)
    assert packed.nbytes == sum(w.nbytes for w in parts.values())
    # Rows and inputs select as they would from the dense weight: a run inside one part is that part's rows.
    assert torch.equal(packed.rows(slice(48, 112)).dequantize(), reference[48:112])
    assert packed.rows(slice(64, 96)).format == "q4_1"
    assert torch.equal(packed.narrow(-1, 32, 32).dequantize(), reference[:, 32:64])
    with pytest.raises(ValueError, match="one contiguous slice"):
        packed.rows(torch.tensor([0, 5]))
