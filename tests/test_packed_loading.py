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


def test_parts_of_one_format_stay_the_parts_not_a_joined_copy() -> None:
    # A GGUF's Q, K and V (or gate and up) are views of its memory map: the fused weight keeps those views, so no
    # joined copy stays resident beside the platform kernel's own (cpu: joined only until it repacks them).
    model, dense = _qkv()
    parts = {part: GGMLWeight.quantized("q8_0", w) for part, w in dense.items()}
    for part, w in parts.items():
        model["qkv"].load("weight", w, part)
    assert finish_loading(model, None) == 1
    packed = packed_weight(model["qkv"])
    assert isinstance(packed, MixedRows) and packed.shape == (128, 64)
    assert [p.tensors["blocks"].data_ptr() for p in packed.parts] == [
        w.tensors["blocks"].data_ptr() for w in parts.values()]
    assert torch.equal(packed.dequantize(), torch.cat([w.dequantize() for w in parts.values()]))


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


def _tied(vocab: int = 96, hidden: int = 64) -> nn.Module:
    from frame.layers import ParallelLMHead, VocabParallelEmbedding

    embed = VocabParallelEmbedding(vocab, hidden, torch.device("cpu"), torch.bfloat16)
    head = ParallelLMHead(hidden, vocab, torch.device("cpu"), torch.bfloat16, weight=embed.weight)
    return nn.ModuleDict({"embed": embed, "head": head})


def test_a_tied_embedding_that_arrived_packed_stays_packed_and_looks_rows_up_exactly() -> None:
    # A GGUF's token_embd read by the embedding and by the LM head: no dense copy of the table (for a 32,000 x 2048
    # table, 125 MiB in bfloat16), each lookup dequantizes only the rows it reads.
    model = _tied()
    table = GGMLWeight.quantized("q8_0", torch.randn(96, 64, generator=torch.Generator().manual_seed(1)))
    model["embed"].load("weight", table)
    assert finish_loading(model, None) == 1
    weight = model["embed"].weight
    assert weight.device.type == "meta" and model["head"].weight is weight and weight.packed is not None
    ids = torch.tensor([[5, 7, 5], [95, 0, 7]])
    expected = table.dequantize().to(torch.bfloat16)[ids]
    assert torch.equal(model["embed"](ids), expected)


def test_a_table_quantized_at_load_stays_dense_for_its_lookups() -> None:
    # int8 quantizes the LM head's weight from dense values; the embedding sharing it keeps them to look up.
    from frame_quantization_int8.method import Int8Method

    model = _tied()
    values = torch.randn(96, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    model["embed"].weight.data.copy_(values)
    assert finish_loading(model, Int8Method()) == 1
    weight = model["embed"].weight
    assert weight.device.type == "cpu" and weight.packed is not None
    assert torch.equal(model["embed"](torch.tensor([3, 4])), values[[3, 4]])
