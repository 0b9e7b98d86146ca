"""ReorderedRows: a packed weight's rows in another order, made only when read, behave as the copy would."""

from __future__ import annotations

import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights import GGMLWeight, MixedRows
from frame.weights.reordered import ReorderedRows


def _weights() -> tuple[GGMLWeight, torch.Tensor, GGMLWeight]:
    """A q4_0 weight, a row order, and the copy in that order the lazy weight stands for."""
    torch.manual_seed(0)
    source = GGMLWeight.quantized("q4_0", torch.randn(48, 64))
    order = torch.randperm(48)
    return source, order, source.rows(order)


def test_it_reads_as_the_reordered_copy() -> None:
    source, order, copy = _weights()
    lazy = ReorderedRows(source, order)
    assert lazy.shape == copy.shape and lazy.nbytes == copy.nbytes and lazy.format == "q4_0"
    assert torch.equal(lazy.tensors["blocks"], copy.tensors["blocks"])
    assert torch.equal(lazy.dequantize(torch.bfloat16), copy.dequantize(torch.bfloat16))
    resolved = lazy.resolved()
    assert type(resolved) is GGMLWeight and torch.equal(resolved.tensors["blocks"], copy.tensors["blocks"])


def test_rows_and_inputs_select_as_on_the_copy() -> None:
    source, order, copy = _weights()
    lazy = ReorderedRows(source, order)
    again = torch.randperm(48)
    for index in (slice(8, 40), again):
        picked = lazy.rows(index)
        assert isinstance(picked, ReorderedRows) and picked.source is source  # still no copy
        assert torch.equal(picked.dequantize(), copy.rows(index).dequantize())
    assert torch.equal(ReorderedRows(lazy, again).dequantize(), copy.rows(again).dequantize())
    assert torch.equal(lazy.narrow(1, 32, 32).dequantize(), copy.narrow(1, 32, 32).dequantize())


def test_joined_and_mixed_weights_take_it_as_a_part() -> None:
    source, order, copy = _weights()
    lazy = ReorderedRows(source, order)
    other = GGMLWeight.quantized("q4_0", torch.randn(16, 64))
    joined = PackedWeight.cat([lazy, other])
    assert type(joined) is GGMLWeight
    assert torch.equal(joined.dequantize(), torch.cat([copy.dequantize(), other.dequantize()]))
    q8 = GGMLWeight.quantized("q8_0", torch.randn(16, 64))
    mixed = MixedRows([lazy, q8])
    assert torch.equal(mixed.dequantize(), torch.cat([copy.dequantize(), q8.dequantize()]))
    views = list(mixed.file_views())  # the file's blocks, which a kernel gives back once it has its own copy
    assert views[0] is source.tensors["blocks"] and views[1] is q8.tensors["blocks"]
