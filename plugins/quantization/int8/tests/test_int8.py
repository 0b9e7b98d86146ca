"""The int8 plugin's own choices: what it skips, its rounding, its options."""

from __future__ import annotations

import pytest
import torch
from frame_quantization_int8 import Int8Method, Int8Options
from pydantic import ValidationError


def test_rows_are_scaled_by_their_own_largest_value() -> None:
    weight = torch.tensor([[1.0, -0.5, 0.25], [100.0, 50.0, -100.0]])
    packed = Int8Method().quantize("layers.0.mlp.down_proj", weight)
    assert packed is not None and packed.tensors["q"].dtype == torch.int8
    assert packed.tensors["q"].tolist() == [[127, -64, 32], [127, 64, -127]]
    torch.testing.assert_close(packed.tensors["scale"].flatten(), torch.tensor([1 / 127, 100 / 127]))


def test_skipped_layers_stay_dense() -> None:
    method = Int8Method(Int8Options(skip=["logits", "o_proj"]))
    weight = torch.randn(4, 8)
    assert method.quantize("logits", weight) is None
    assert method.quantize("layers.3.attn.o_proj", weight) is None
    assert method.quantize("layers.3.attn.qkv", weight) is not None


def test_an_all_zero_row_stays_zero() -> None:
    packed = Int8Method().quantize("x", torch.zeros(2, 4))
    assert packed is not None and torch.equal(packed.dequantize(), torch.zeros(2, 4))


def test_activations_option_is_carried_and_checked() -> None:
    assert Int8Method(Int8Options(activations="none")).quantize("x", torch.ones(1, 2)).activations == "none"
    with pytest.raises(ValidationError):
        Int8Options(activations="static")
