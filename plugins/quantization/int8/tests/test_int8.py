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


def test_the_output_projection_stays_dense_by_default() -> None:
    # The model families name it lm_head; its logits pick the tokens.
    assert Int8Method().quantize("lm_head", torch.randn(4, 8)) is None
    assert Int8Method().quantize("layers.0.mlp.down_proj", torch.randn(4, 8)) is not None


def test_smoothing_moves_an_outlier_feature_into_the_weight_and_keeps_the_product() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(32, 64, generator=gen)
    absmax = torch.ones(64)
    absmax[5] = 50.0  # one input feature fifty times the others
    packed = Int8Method().quantize("layers.0.mlp.down_proj", weight, input_absmax=absmax)
    assert packed.input_scale is not None and packed.input_scale.shape == (64,)
    assert packed.input_scale[5] < packed.input_scale[0]  # the outlier feature is divided down the most
    # Half a step of the smoothed row, which is 1 / input_scale as large in the original weight's terms.
    bound = packed.tensors["scale"] * packed.input_scale / 2 * (1 + 1e-3) + 1e-7
    assert ((packed.dequantize() - weight).abs() <= bound).all()
    half = packed.narrow(1, 32, 32)
    torch.testing.assert_close(half.dequantize(), packed.dequantize()[:, 32:])
    assert Int8Method(Int8Options(smoothing=0)).calibration_text() is None
    assert Int8Method(Int8Options(activations="none")).calibration_text() is None
    assert len(Int8Method().calibration_text()) > 1000
    plain = Int8Method(Int8Options(smoothing=0)).quantize("w", weight, input_absmax=absmax)
    assert plain.input_scale is None


def test_smoothed_w8a8_is_closer_to_the_dense_product_on_outlier_activations() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(48, 128, generator=gen) * 0.05
    x = torch.randn(16, 128, generator=gen)
    x[:, 7] *= 40  # an outlier feature, as LLM activations have
    dense = x @ weight.T

    def w8a8(packed) -> torch.Tensor:  # per-token int8 of x (times the smoothing factors) against q
        xs = x * (packed.input_scale if packed.input_scale is not None else 1.0)
        step = xs.abs().amax(dim=1, keepdim=True) / 127
        return (torch.round(xs / step) * step) @ (packed.tensors["q"].float() * packed.tensors["scale"]).T

    smoothed = Int8Method().quantize("w", weight, input_absmax=x.abs().amax(dim=0))
    plain = Int8Method().quantize("w", weight)
    assert (w8a8(smoothed) - dense).norm() < 0.5 * (w8a8(plain) - dense).norm()
