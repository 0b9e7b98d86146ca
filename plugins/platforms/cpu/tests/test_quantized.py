"""The cpu platform's kernels for packed ggml blocks (q4_0, q4_1, q8_0), the AVX-512 VNNI, AVX2 and portable paths,
against gguf's own dequantisation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame.weights import GGMLWeight
from frame_platform_cpu import kernels, probe, quantized

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")
PATHS = [pytest.param({"portable": True}, id="portable"),
         pytest.param({"portable": False, "vnni": False}, id="avx2",
                      marks=pytest.mark.skipif(not probe.has_avx2_fma(), reason="no AVX2 and FMA")),
         pytest.param({"portable": False, "vnni": True}, id="avx512_vnni",
                      marks=pytest.mark.skipif(not quantized.has_vnni(), reason="no AVX-512 VNNI and BW"))]


def packed(fmt: str, rows: int, inputs: int, seed: int = 0) -> GGMLWeight:
    return GGMLWeight.quantized(fmt, torch.randn(rows, inputs, generator=torch.Generator().manual_seed(seed)))


def quantized_inputs(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it: each block of 32 rounded to int8 steps of max|x| / 127 (half to even, as C++'s
    nearbyint), in float64."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = (amax / 127).float().double()  # the kernel keeps d_x in float32
    inverse = torch.where(amax > 0, (127 / amax.float()).double(), torch.zeros_like(amax))
    q = torch.round((blocks.float() * inverse.float()).double())
    return (q * scale).reshape(x.shape)


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9, 17])
# 40: the VNNI layout's last group of 16 is padded; 200: one row takes 13 groups as three sets of four in step
# (group_set_vnni) and a last, padded group alone.
@pytest.mark.parametrize("out_features", [48, 40, 200])
def test_ggml_linear_is_the_dequantised_product(fmt: str, rows: int, out_features: int, portable: dict) -> None:
    weight = packed(fmt, out_features, 96)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1))
    kernel = quantized.ggml_linear(weight, bias, **portable)
    y = kernel(x)
    dense = weight.dequantize().double()
    # Exact arithmetic on the int8-rounded x: the kernel sums each block's 32 integer products exactly, so only
    # float32 rounding of the per-block terms and their sum (96 inputs: 3 blocks) remains, ~1e-6 of the scale.
    exact = quantized_inputs(x) @ dense.T + bias.double()
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-4)
    # Against float32 x: rounding x to 255 levels per block moves each product by at most max|x_block| / 254, so
    # a dot over 96 inputs moves by far less than 2% of sum(|w| |x|).
    loose = F.linear(x.double(), dense, bias.double())
    bound = 0.02 * (x.double().abs() @ dense.abs().T)
    assert ((y.double() - loose).abs() <= bound + 1e-6).all()


@pytest.mark.parametrize("portable", PATHS)
def test_bfloat16_rows_come_back_bfloat16(portable: dict) -> None:
    weight = packed("q4_1", 32, 64)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    xb = x.bfloat16()
    y = quantized.ggml_linear(weight, None, **portable)(xb)
    assert y.dtype == torch.bfloat16
    # The kernel quantizes the bfloat16 rows per block exactly as float32 ones (a bfloat16 value is one), so the
    # only further error is the result's one rounding to bfloat16 (8 bits of mantissa).
    exact = quantized_inputs(xb.float()) @ weight.dequantize().double().T
    torch.testing.assert_close(y.double(), exact, rtol=2**-8, atol=1e-3)


def test_paths_agree_on_a_large_weight() -> None:
    if not probe.has_avx2_fma():
        pytest.skip("no AVX2 and FMA: only the portable path runs here")
    weight = packed("q4_1", 200, 576, seed=4)
    x = torch.randn(6, 576, generator=torch.Generator().manual_seed(5))
    plain = quantized.ggml_linear(weight, None, portable=True)(x)
    for vnni in (False, True) if quantized.has_vnni() else (False,):
        fast = quantized.ggml_linear(weight, None, portable=False, vnni=vnni)(x)
        torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-4)  # only the order of float32 block sums differs


@pytest.mark.skipif(not quantized.has_vnni(), reason="no AVX-512 VNNI and BW")
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vnni_rows_do_not_depend_on_their_batch(fmt: str, dtype: torch.dtype) -> None:
    # A lone row takes the decode loop (groups in step), a batch the row tiles: the same sums, bit for bit.
    weight = packed(fmt, 200, 576, seed=6)
    bias = torch.randn(200, generator=torch.Generator().manual_seed(8))
    linear = quantized.ggml_linear(weight, bias, vnni=True)
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(7)).to(dtype)
    together = linear(x)
    for row in (0, 3, 4, 10):
        assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])


def _k_quant(fmt: str, rows: int, inputs: int, seed: int) -> GGMLWeight:
    """Random, valid q4_K or q6_K blocks (every byte random but the float16 scales, kept small and finite)."""
    gen = torch.Generator().manual_seed(seed)
    size = {"q4_k": 144, "q6_k": 210}[fmt]
    blocks = torch.randint(0, 256, (rows, inputs // 256, size), generator=gen, dtype=torch.uint8)
    halves = (torch.rand(rows, inputs // 256, 2, generator=gen) * 0.004 + 0.0005).half().view(torch.uint8)
    if fmt == "q4_k":
        blocks[..., :4] = halves.reshape(rows, -1, 4)  # d, dmin
    else:
        blocks[..., 208:] = halves[..., :2]  # d, after ql, qh and the int8 scales
    return GGMLWeight(fmt, blocks.reshape(rows, -1), inputs)


def test_q4_k_rewritten_as_q4_1_keeps_its_values_but_for_float16_scales() -> None:
    weight = _k_quant("q4_k", 48, 512, seed=1)
    rewritten = GGMLWeight("q4_1", quantized.q4_k_as_q4_1(weight.tensors["blocks"]), 512)
    exact, got = weight.dequantize().double(), rewritten.dequantize().double()
    # d * sc and dmin * m each rounded to float16: at most 2^-11 of each term, |q| <= 15.
    bound = (exact.abs() + 64 * 0.0045) * 2.0**-10
    assert ((got - exact).abs() <= bound).all()


def test_q6_k_rewritten_as_q8_0_is_within_about_half_an_8_bit_step() -> None:
    weight = _k_quant("q6_k", 48, 512, seed=2)
    exact = weight.dequantize()
    rewritten = GGMLWeight.quantized("q8_0", exact).dequantize()
    step = exact.reshape(48, -1, 32).abs().amax(-1, keepdim=True) / 127
    # Half a step, plus the float16 rounding of d (2^-11 of it) times |q| <= 127, as in ggml's own q8_0 blocks.
    assert ((rewritten - exact).reshape(48, -1, 32).abs() <= step * (0.5 + 127 * 2.0**-11)).all()


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("fmt", ["q4_k", "q6_k"])
def test_k_quants_run_a_kernel_close_to_their_dequantised_product(fmt: str, portable) -> None:
    weight = _k_quant(fmt, 64, 512, seed=3)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(4))
    kernel = quantized.ggml_linear(weight, None, **portable)
    assert kernel is not None
    exact = x.double() @ weight.dequantize().double().T
    # x's int8 rounding per block of 32 and the rewriting: well under a percent of the output's spread.
    assert (kernel(x).double() - exact).abs().max() <= 0.01 * exact.abs().max()
    assert fmt in quantized.served_formats()


def test_the_kernel_declines_other_inputs() -> None:
    kernel = quantized.ggml_linear(packed("q8_0", 16, 32), None)
    assert kernel(torch.zeros(2, 3, 32)) is None
    assert kernel(torch.zeros(2, 32, dtype=torch.float64)) is None


def _int8(rows: int, inputs: int, activations: str = "dynamic"):
    from frame.interfaces.quantization import PackedWeight

    class ChannelInt8(PackedWeight):  # the int8 format's contract (FORMATS["int8"]); the plugin's own class is
        # another wheel, which a platform must not import
        def __init__(self, tensors: dict[str, torch.Tensor], in_features: int) -> None:
            super().__init__("int8", tensors, in_features)
            self.activations = activations

        def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return (self.tensors["q"].float() * self.tensors["scale"]).to(dtype)

        def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
            return ChannelInt8(tensors, in_features)

    w = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(7)) * 0.05
    scale = w.abs().amax(1, keepdim=True) / 127
    return ChannelInt8({"q": torch.round(w / scale).to(torch.int8), "scale": scale}, inputs)


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("rows", [1, 5])
def test_int8_w8a8_is_the_product_of_int8_rows(rows: int, portable: dict) -> None:
    weight = _int8(48, 96)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1))
    y = quantized.int8_linear(weight, bias, **portable)(x)
    # The row scales go through float16 (2^-11 relative), x is rounded to int8 per block of 32 as for q8_0.
    scale16 = weight.tensors["scale"].half().double()
    exact = quantized_inputs(x) @ (weight.tensors["q"].double() * scale16).T + bias.double()
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)


def test_weight_only_int8_and_tiny_scales_decline() -> None:
    assert quantized.int8_linear(_int8(16, 32, activations="none"), None) is None
    tiny = _int8(16, 32)
    tiny.tensors["scale"] = tiny.tensors["scale"] * 1e-4  # below float16's normal range
    assert quantized.int8_linear(tiny, None) is None
