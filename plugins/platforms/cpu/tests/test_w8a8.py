"""The W8A8 kernel (``w8a8_linear.cpp``): int8 weights per output channel against x quantized per row, on AMX
int8 tiles and on AVX-512 VNNI, against exact arithmetic on the same int8 values."""

from __future__ import annotations

import pytest
import torch
from frame_platform_cpu import kernels, w8a8
from frame_quantization_int8.method import Int8Method

_WHY_NOT = kernels.unavailable_reason()
pytestmark = [
    pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}"),
    pytest.mark.skipif(not w8a8.has_vnni(), reason="the W8A8 kernel needs AVX-512 VNNI, BW and BF16"),
]
PATHS = [pytest.param("vnni", id="vnni"),
         pytest.param("amx", id="amx", marks=pytest.mark.skipif(
             _WHY_NOT is not None or not w8a8.amx_int8_usable(), reason="no usable AMX int8 tiles"))]


def _weight(rows: int, inputs: int, seed: int = 0):
    return Int8Method().quantize("w", torch.randn(rows, inputs, generator=torch.Generator().manual_seed(seed)))


def _exact(x: torch.Tensor, packed, bias: torch.Tensor | None) -> torch.Tensor:
    """The product on x rounded per row as the kernel rounds it, in float64."""
    amax = x.float().abs().amax(dim=1, keepdim=True)
    scale = (amax.double() / 127).float()
    # 127 / amax as C++ computes it in float32 (correctly rounded; torch's own division may differ in the last bit,
    # which moves a value sitting on a rounding tie of x / scale by one step).
    inverse = torch.where(amax > 0, (127 / amax.double()).float(), torch.zeros_like(amax))
    q = torch.round(x.float() * inverse).clamp(-127, 127)
    y = (q.double() @ packed.tensors["q"].double().T) * scale.double() * packed.tensors["scale"].double().T
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 12, 13, 16, 17, 33, 70])
@pytest.mark.parametrize(("out_features", "with_bias"), [(96, False), (208, True)])
def test_w8a8_is_the_exact_product_of_the_rounded_rows(path: str, rows: int, out_features: int,
                                                         with_bias: bool) -> None:
    packed = _weight(out_features, 576)
    gen = torch.Generator().manual_seed(rows)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    x = torch.randn(rows, 576, generator=gen)
    y = w8a8.w8a8_linear(packed, bias, path=path)(x)
    assert y.dtype == torch.float32 and y.shape == (rows, out_features)
    # Integer sums are exact; only the epilogue's float32 scaling rounds.
    torch.testing.assert_close(y.double(), _exact(x, packed, bias), rtol=1e-5, atol=1e-4)
    yb = w8a8.w8a8_linear(packed, bias, path=path)(x.bfloat16())
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.double(), _exact(x.bfloat16(), packed, bias), rtol=8e-3, atol=1e-2)


def test_both_paths_give_the_same_bits_and_rows_do_not_depend_on_their_batch() -> None:
    packed = _weight(192, 1536, seed=3)
    # 400 rows: three blocks of rows for in_features 1536 (kRowBlockBytes), x quantized on both threads.
    x = torch.randn(400, 1536, generator=torch.Generator().manual_seed(4)).bfloat16()
    paths = ["vnni", "amx"] if w8a8.amx_int8_usable() else ["vnni"]
    results = [w8a8.w8a8_linear(packed, None, path=p)(x) for p in paths]
    assert all(torch.equal(results[0], r) for r in results)
    linear = w8a8.w8a8_linear(packed, None)
    for row in (0, 7, 8, 11, 12, 39, 167, 168, 399):
        assert torch.equal(linear(x[row : row + 1]), results[0][row : row + 1])
    assert torch.equal(linear(x[:40]), results[0][:40])


def test_inputs_not_a_multiple_of_64_take_vnni_and_odd_shapes_are_declined() -> None:
    packed = _weight(64, 100)
    x = torch.randn(3, 100)
    torch.testing.assert_close(w8a8.w8a8_linear(packed, None)(x).double(), _exact(x, packed, None), rtol=1e-5,
                               atol=1e-4)
    assert w8a8.w8a8_linear(_weight(40, 64), None) is None  # 40 outputs: not a multiple of 16
    weight_only = Int8Method(Int8Method().options.model_copy(update={"activations": "none"})).quantize(
        "w", torch.randn(64, 64))
    assert w8a8.w8a8_linear(weight_only, None) is None


def test_the_gated_kernel_has_the_bits_of_the_product_then_the_activation() -> None:
    packed = Int8Method().quantize("w", torch.randn(2 * 64, 576, generator=torch.Generator().manual_seed(5)) * 0.1)
    bias = torch.randn(2 * 64, generator=torch.Generator().manual_seed(6))
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(7)).bfloat16()
    swiglu = w8a8.layer_kernel(packed, bias, gated=True)
    expected = kernels.fused_silu_and_mul()(w8a8.w8a8_linear(packed, bias)(x))
    assert torch.equal(swiglu(x), expected)
    gate, up = w8a8.w8a8_linear(packed, bias)(x.float()).chunk(2, dim=-1)
    torch.testing.assert_close(swiglu(x.float()), torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("path", PATHS)
def test_a_smoothed_weight_takes_x_times_its_input_scale(path: str) -> None:
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(5, 576, generator=gen)
    packed = Int8Method().quantize("w", torch.randn(64, 576, generator=gen), input_absmax=x.abs().amax(dim=0) * 3)
    assert packed.input_scale is not None
    y = w8a8.w8a8_linear(packed, None, path=path)(x)
    torch.testing.assert_close(y.double(), _exact(x * packed.input_scale, packed, None), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(y, x @ packed.dequantize().T, rtol=0.05, atol=0.3)
