"""The AMX tile kernels (``amx_linear.cpp``) against the exact product and the AVX-512 BF16 kernel.

They run only on CPUs with AMX BF16 tiles (Sapphire Rapids and later) whose Linux grants the tile state; elsewhere
they skip, naming the reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame_platform_cpu import kernels, probe

_WHY_NOT = kernels.unavailable_reason()
pytestmark = [
    pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}"),
    pytest.mark.skipif(_WHY_NOT is not None or not kernels.amx_usable(),
                       reason=f"this CPU has no usable AMX BF16 tiles (flags: amx_bf16={probe.has_amx()})"),
]


def _amx(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.frame_cpu.amx_linear(x, kernels.pack_weight(weight), None if bias is None else bias.float(),
                                          weight.shape[0])


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 32, 33, 300])
@pytest.mark.parametrize(("out_features", "with_bias"), [(96, False), (208, True)])
def test_amx_linear_matches_the_exact_product(rows: int, out_features: int, with_bias: bool) -> None:
    # 208 outputs: six whole 32-column panels and a 16-column one; 16 and 32 rows fill one and two tiles of x.
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=gen).bfloat16()
    weight = torch.randn(out_features, 576, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16() if with_bias else None
    got = _amx(x, weight, bias)
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    torch.testing.assert_close(got.double(), exact, rtol=8e-3, atol=1e-2)


def test_amx_rows_do_not_depend_on_their_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 1536, generator=gen).bfloat16()
    x = torch.randn(70, 1536, generator=gen).bfloat16()
    together = _amx(x, weight, None)
    for row in (0, 15, 16, 31, 32, 69):
        assert torch.equal(_amx(x[row : row + 1], weight, None), together[row : row + 1])
        assert torch.equal(_amx(x[row:], weight, None), together[row:])
    # Fewer than 16 rows run on tiles of that many rows, loaded from x itself: the same bits as in a full tile.
    for row, count in ((0, 2), (3, 5), (40, 15), (55, 15)):
        assert torch.equal(_amx(x[row : row + count], weight, None), together[row : row + count])


def test_a_weight_of_several_panel_groups_per_thread_matches_the_exact_product_row_by_row() -> None:
    # 1,536 inputs make a panel 96 KB, so a thread's panels of this 1,488-column weight (46 whole and a 16-column
    # one) go in several groups of at most 1 MB (amx_gemm.h), each a pass over every block of rows.
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(1488, 1536, generator=gen).bfloat16()
    x = torch.randn(70, 1536, generator=gen).bfloat16()
    together = _amx(x, weight, None)
    torch.testing.assert_close(together.double(), F.linear(x.double(), weight.double()), rtol=8e-3, atol=3e-2)
    for row in (0, 33, 69):
        assert torch.equal(_amx(x[row : row + 1], weight, None), together[row : row + 1])


@pytest.mark.parametrize("rows", [1, 40])
def test_amx_swiglu_has_the_bits_of_the_amx_linear_then_the_activation_kernel(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(2 * 64, 576, generator=gen) * 0.1).bfloat16()
    bias = torch.randn(2 * 64, generator=gen).bfloat16()
    x = torch.randn(rows, 576, generator=gen).bfloat16()
    fused = kernels.bfloat16_swiglu_projection(weight, bias)(x)
    unfused = kernels.fused_silu_and_mul()(_amx(x, weight, bias))
    assert fused.shape == (rows, 64) and torch.equal(fused, unfused)


def test_bfloat16_linears_take_the_tiles_where_the_inputs_are_a_multiple_of_32() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 576, generator=gen).bfloat16()
    x = torch.randn(5, 576, generator=gen).bfloat16()
    assert torch.equal(kernels.bfloat16_linear(weight, None)(x), _amx(x, weight, None))
    odd = torch.randn(64, 600, generator=gen).bfloat16()  # 600 inputs: the AVX-512 BF16 kernel
    y = torch.randn(5, 600, generator=gen).bfloat16()
    packed = kernels.pack_weight(odd)
    assert torch.equal(kernels.bfloat16_linear(odd, None)(y), torch.ops.frame_cpu.packed_linear(y, packed, None, 64))


@pytest.mark.parametrize("rows", [1, 33, 64])
def test_amx_float_output_is_the_linear_before_its_rounding(rows: int) -> None:
    # The output projection's logits: the same float32 sums amx_linear rounds, closer to the exact product.
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(208, 576, generator=gen).bfloat16()
    bias = torch.randn(208, generator=gen).bfloat16()
    x = torch.randn(rows, 576, generator=gen).bfloat16()
    got = kernels.bfloat16_linear(weight, bias, float_output=True)(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 208)
    assert torch.equal(got.bfloat16(), _amx(x, weight, bias))
    exact = F.linear(x.double(), weight.double(), bias.double())
    assert (got.double() - exact).abs().max() < (_amx(x, weight, bias).double() - exact).abs().max()
