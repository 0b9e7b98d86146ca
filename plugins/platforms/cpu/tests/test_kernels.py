"""The cpu platform's native kernels: the packed bfloat16 linear, fused norm, activation and rotary."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame.layers import Linear, RMSNorm, RotateHalves, SiluAndMul
from frame_platform_cpu import kernels, probe
from frame_platform_cpu.platform import CpuOptions, CpuPlatform

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")
needs_avx512_bf16 = pytest.mark.skipif(not probe.has_avx512_bf16(), reason="the packed kernels need AVX-512 BF16")
# Without AVX-512 BF16 and AVX2 the bfloat16 linear is oneDNN's, which needs AVX-512 (BW, VL, DQ) or
# AVX-NE-CONVERT; CPUs with AVX2 store bfloat16 and compute in float32 instead (test_bfloat16_storage.py).
needs_bf16_linear = pytest.mark.skipif(
    not probe.has_avx512_bf16() and not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="this CPU has no bfloat16 linear (neither AVX-512 BF16 nor oneDNN's bfloat16 path)",
)


@pytest.fixture(autouse=True)
def _kernels_loaded() -> None:
    kernels.load()


def test_packed_weight_layout_pairs_inputs_per_column_panel() -> None:
    weight = torch.arange(48 * 6, dtype=torch.float32).reshape(48, 6).bfloat16()
    packed = kernels.pack_weight(weight)
    whole = packed[: 32 * 6].reshape(3, 32, 2)  # one 32-column panel: [in / 2][32][2]
    tail = packed[32 * 6 :].reshape(3, 16, 2)  # then a 16-column one
    for pair in range(3):
        for column in range(32):
            assert torch.equal(whole[pair, column], weight[column, 2 * pair : 2 * pair + 2])
        for column in range(16):
            assert torch.equal(tail[pair, column], weight[32 + column, 2 * pair : 2 * pair + 2])


@needs_bf16_linear
@pytest.mark.parametrize("rows", [1, 2, 13, 14, 15, 64, 300])
@pytest.mark.parametrize(("out_features", "with_bias"), [(96, False), (208, True)])
def test_packed_linear_matches_the_exact_product(rows: int, out_features: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    # 208 outputs: six whole 32-column panels and a 16-column one; 14 rows a register tile, so 15 and 300 leave one.
    x = torch.randn(rows, 600, generator=gen).bfloat16()
    weight = torch.randn(out_features, 600, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16() if with_bias else None
    got = kernels.bfloat16_linear(weight, bias)(x)
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    # One bfloat16 rounding of a float32 sum: within an ulp of bfloat16 (2^-8 relative) of the exact value.
    torch.testing.assert_close(got.double(), exact, rtol=8e-3, atol=1e-2)


@needs_avx512_bf16
@pytest.mark.parametrize("rows", [1, 15, 64])
def test_float_output_is_the_packed_linear_before_its_rounding(rows: int) -> None:
    # The output projection's logits. 600 inputs (not a multiple of 32): the AVX-512 BF16 kernel on every CPU
    # with it, AMX's included; 208 outputs leave a 16-column panel.
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 600, generator=gen).bfloat16()
    weight = torch.randn(208, 600, generator=gen).bfloat16()
    bias = torch.randn(208, generator=gen).bfloat16()
    got = kernels.bfloat16_linear(weight, bias, float_output=True)(x)
    rounded = kernels.bfloat16_linear(weight, bias)(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 208)
    assert torch.equal(got.bfloat16(), rounded)
    exact = F.linear(x.double(), weight.double(), bias.double())
    assert (got.double() - exact).abs().max() < (rounded.double() - exact).abs().max()


@needs_avx512_bf16
def test_a_rows_result_does_not_depend_on_its_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 576, generator=gen).bfloat16()
    linear = kernels.bfloat16_linear(weight, None)
    x = torch.randn(500, 576, generator=gen).bfloat16()  # three blocks of rows (kRowBlockBytes) for k = 576
    together = linear(x)
    for row in (0, 13, 14, 39, 223, 224, 499):
        assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])
        assert torch.equal(linear(x[row:]), together[row:])


@needs_avx512_bf16
@pytest.mark.parametrize("rows", [1, 15, 64, 500])
@pytest.mark.parametrize("with_bias", [False, True])
def test_swiglu_projection_has_the_bits_of_the_linear_then_the_activation_kernel(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight = (torch.randn(2 * 48, 576, generator=gen) * 0.1).bfloat16()  # 48 features: three 16-column pairs
    bias = torch.randn(2 * 48, generator=gen).bfloat16() if with_bias else None
    x = torch.randn(rows, 576, generator=gen).bfloat16()
    fused = kernels.bfloat16_swiglu_projection(weight, bias)(x)
    unfused = kernels.fused_silu_and_mul()(kernels.bfloat16_linear(weight, bias)(x))
    assert fused.shape == (rows, 48) and torch.equal(fused, unfused)
    gate_up = F.linear(x, weight, bias)
    torch.testing.assert_close(fused, F.silu(gate_up[:, :48]) * gate_up[:, 48:], rtol=2e-2, atol=2e-2)


@needs_avx512_bf16
def test_swiglu_projection_declines_what_it_cannot_pack() -> None:
    assert kernels.bfloat16_swiglu_projection(torch.randn(2 * 40, 64).bfloat16(), None) is None  # 40 features
    swiglu = kernels.bfloat16_swiglu_projection(torch.randn(2 * 32, 64).bfloat16(), None)
    assert swiglu(torch.randn(2, 3, 64).bfloat16()) is None and swiglu(torch.randn(2, 64)) is None


@needs_bf16_linear
@pytest.mark.parametrize("rows", [1, 64])
def test_shapes_the_packed_kernel_does_not_take_go_to_onednn_bitwise_equal_to_f_linear(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(100, 48, generator=gen).bfloat16(), torch.randn(100, generator=gen).bfloat16()
    linear = kernels.bfloat16_linear(weight, bias)  # 100 outputs: not a multiple of 16
    x = torch.randn(rows, 48, generator=gen).bfloat16()
    assert torch.equal(linear(x), F.linear(x, weight, bias))
@needs_bf16_linear
def test_other_ranks_go_to_f_linear() -> None:
    weight = torch.randn(64, 32).bfloat16()
    linear = kernels.bfloat16_linear(weight, None)
    batched = torch.randn(2, 3, 32).bfloat16()
    assert torch.equal(linear(batched), F.linear(batched, weight))


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_fused_norm_equals_the_reference_but_for_summation_order(rows: int) -> None:
    norm = RMSNorm(576, 1e-5, torch.device("cpu"), torch.bfloat16)
    norm.weight.data.normal_(1.0, 0.1, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(rows)
    x, residual = (torch.randn(rows, 576, generator=gen).bfloat16() * 3 for _ in range(2))
    fused = kernels.fused_add_rms_norm(norm.weight, 1e-5)(x, residual)
    assert fused is not None
    expected_out, expected_sum = norm.reference(x, residual)
    assert torch.equal(fused[1], expected_sum)
    # The float32 sum of squares runs in another order: a few values may land one bfloat16 step apart.
    torch.testing.assert_close(fused[0].float(), expected_out.float(), rtol=8e-3, atol=8e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_norm_without_a_residual_is_the_fused_norm_over_a_residual_of_zeros(dtype: torch.dtype, rows: int) -> None:
    # A model's first norm (no residual yet) takes plain_rms_norm: the same rounding as add_rms_norm's output with
    # zeros added, the row itself handed back as the residual, as the reference does.
    norm = RMSNorm(576, 1e-5, torch.device("cpu"), dtype)
    norm.weight.data.normal_(1.0, 0.1, generator=torch.Generator().manual_seed(0))
    x = (torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows)) * 3).to(dtype)
    kernel = kernels.fused_add_rms_norm(norm.weight, 1e-5)
    plain = kernel(x, None)
    assert plain is not None and plain[1] is x
    assert torch.equal(plain[0], kernel(x, torch.zeros_like(x))[0])
    expected, _ = norm.reference(x)
    tolerance = {"rtol": 8e-3, "atol": 8e-3} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(plain[0].float(), expected.float(), **tolerance)
    out = torch.empty_like(x)
    torch.ops.frame_cpu.plain_rms_norm_into(x, norm.weight, 1e-5, out)
    assert torch.equal(out, plain[0])


def test_the_fused_norms_rounded_sum_is_torchs_for_every_kind_of_value() -> None:
    """The residual sum goes through the kernels' float32 -> bfloat16 rounding alone (vcvtneps2bf16, or the integer
    version on CPUs without AVX-512 BF16): ties to even, overflow to infinity, NaN; denormals only where torch keeps
    them too (vcvtneps2bf16 flushes denormal inputs)."""
    tiny = 2.0**-133  # a float32 denormal that a bfloat16 one can hold
    values = [1.0, 1.00390625, 1.01171875, -2.5, 3.0e38, 3.4e38, float("inf"), float("-inf"), float("nan"), 0.0,
              -0.0, 1e-30, 65504.0, 7.0, -1.5, 0.125]
    x = torch.tensor([values], dtype=torch.float32).bfloat16()
    # residual chosen so that x + residual in float32 hits ties and carries when rounded
    residual = torch.tensor([[2.0**-9, 2.0**-9, 2.0**-9, 0.0, 3.0e38, 3.4e38, 1.0, -1.0, 0.0, 0.0, -0.0, 1e-30,
                              1.0, 2.0**-6, 0.0, 0.0]], dtype=torch.float32).bfloat16()
    summed = kernels.fused_add_rms_norm(torch.ones(16, dtype=torch.bfloat16), 1e-5)(x, residual)[1]
    expected = (x.float() + residual.float()).bfloat16()
    nan = expected.isnan()
    assert torch.equal(summed.isnan(), nan)  # NaN stays NaN (its payload bits differ between torch's own paths)
    assert torch.equal(summed[~nan].view(torch.int16), expected[~nan].view(torch.int16))
    if not probe.has_avx512_bf16():  # the integer rounding keeps denormals, as torch does
        d = torch.tensor([[tiny] * 16], dtype=torch.float32).bfloat16()
        got = kernels.fused_add_rms_norm(torch.ones(16, dtype=torch.bfloat16), 1e-5)(d, torch.zeros_like(d))[1]
        assert torch.equal(got.view(torch.int16), (d.float() * 1).bfloat16().view(torch.int16))


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("hidden", [576, 37])
def test_fused_float32_norm_is_the_reference_within_float32_noise(rows: int, hidden: int) -> None:
    norm = RMSNorm(hidden, 1e-5, torch.device("cpu"), torch.float32)
    norm.weight.data.normal_(1.0, 0.1, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(rows)
    x, residual = (torch.randn(rows, hidden, generator=gen) * 3 for _ in range(2))
    fused = kernels.fused_add_rms_norm(norm.weight, 1e-5)(x, residual)
    assert fused is not None
    expected_out, expected_sum = norm.reference(x, residual)
    assert torch.equal(fused[1], expected_sum)
    torch.testing.assert_close(fused[0], expected_out, rtol=1e-5, atol=1e-6)


def test_fused_norm_declines_rows_of_another_dtype_than_its_weight() -> None:
    weight = torch.ones(8, dtype=torch.bfloat16)
    assert kernels.fused_add_rms_norm(weight, 1e-6)(torch.ones(2, 8), torch.ones(2, 8)) is None
    assert kernels.fused_add_rms_norm(weight.float(), 1e-6)(torch.ones(2, 8).half(), torch.ones(2, 8).half()) is None


def test_fused_silu_and_mul_matches_torch_within_a_step() -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 2 * 300, generator=gen) * 4).bfloat16()
    got = kernels.fused_silu_and_mul()(x)
    expected = SiluAndMul.reference(x)
    assert got is not None and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), rtol=8e-3, atol=1e-3)
    assert (got != expected).float().mean() < 0.01
    assert kernels.fused_silu_and_mul()(x.half()) is None


@pytest.mark.parametrize("rows, width", [(1, 1536), (1, 300), (37, 300), (3, 5)])
def test_fused_float32_silu_and_mul_is_torchs_within_float32_noise(rows: int, width: int) -> None:
    # A row is split in pieces of 256 columns (a lone decode row's share of a team): widths past and between them.
    x = torch.randn(rows, 2 * width, generator=torch.Generator().manual_seed(width)) * 4
    got = kernels.fused_silu_and_mul()(x)
    assert got is not None and got.shape == (rows, width)
    torch.testing.assert_close(got, SiluAndMul.reference(x), rtol=1e-5, atol=1e-6)
    out = torch.empty(rows, width)
    torch.ops.frame_cpu.silu_and_mul_into(x, out)
    assert torch.equal(out, got)


@pytest.mark.parametrize("tokens", [1, 7, 130])
def test_fused_rotary_is_bitwise_torchs_on_the_strided_qk_columns(tokens: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (4 + 2 + 2) * 64, generator=gen).bfloat16()
    angles = torch.rand(tokens, 1, 32, generator=gen) * 6
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    expected = qkv.clone()
    RotateHalves.reference(expected[:, : 6 * 64].view(tokens, 6, 64), cos, sin)
    assert kernels.fused_rotate_halves()(qkv[:, : 6 * 64].view(tokens, 6, 64), cos, sin)
    assert torch.equal(qkv, expected)  # V columns untouched, Q/K rotated exactly as torch does


@pytest.mark.parametrize("tokens", [1, 7])
def test_fused_float32_rotary_is_torchs_within_float32_noise(tokens: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (4 + 2 + 2) * 64, generator=gen)
    angles = torch.rand(tokens, 1, 32, generator=gen) * 6
    expected = qkv.clone()
    RotateHalves.reference(expected[:, : 6 * 64].view(tokens, 6, 64), angles.cos(), angles.sin())
    assert kernels.fused_rotate_halves()(qkv[:, : 6 * 64].view(tokens, 6, 64), angles.cos(), angles.sin())
    assert torch.equal(qkv[:, 6 * 64 :], expected[:, 6 * 64 :])  # V columns untouched
    torch.testing.assert_close(qkv, expected, rtol=1e-5, atol=1e-6)


def test_the_platform_offers_kernels_for_bfloat16_layers_and_float32_norms() -> None:
    cpu = torch.device("cpu")
    platform = CpuPlatform()
    assert platform.layer_kernel(Linear(4, 4, False, cpu, torch.float32)) is None  # out_features not a multiple of 16
    assert platform.layer_kernel(RMSNorm(4, 1e-6, cpu, torch.float32)) is not None
    assert platform.layer_kernel(RMSNorm(4, 1e-6, cpu, torch.float16)) is None
    bf16_layers = [Linear(4, 4, False, cpu, torch.bfloat16), RMSNorm(4, 1e-6, cpu, torch.bfloat16), SiluAndMul()]
    if probe.has_bf16():
        assert all(platform.layer_kernel(layer) is not None for layer in bf16_layers)
    off = CpuPlatform(CpuOptions(native_kernels=False))
    assert all(off.layer_kernel(layer) is None for layer in bf16_layers)
@needs_bf16_linear
def test_without_avx512_bf16_linears_take_onednn_and_swiglu_stays_unfused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "has_avx512_bf16", lambda: False)  # as on an Arm CPU with BF16
    weight = torch.randn(64, 32).bfloat16()
    x = torch.randn(3, 32).bfloat16()
    assert torch.equal(kernels.bfloat16_linear(weight, None)(x), F.linear(x, weight))
    assert kernels.bfloat16_swiglu_projection(weight, None) is None


needs_avx2_fma = pytest.mark.skipif(not probe.has_avx2_fma(), reason="the packed float32 kernel needs AVX2 and FMA")


@needs_avx2_fma
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 8, 13, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_float32_linear_matches_the_exact_product(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 200, generator=gen), torch.randn(96, 200, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    got = kernels.float32_linear(weight, bias)(x)
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert got.dtype == torch.float32 and got.shape == (rows, 96)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-4)


@needs_avx2_fma
def test_packed_float32_rows_do_not_depend_on_their_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    linear = kernels.float32_linear(torch.randn(64, 96, generator=gen), None)
    x = torch.randn(20, 96, generator=gen)
    together = linear(x)
    for row in (0, 5, 6, 19):
        assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])
        assert torch.equal(linear(x[row:]), together[row:])


@needs_avx2_fma
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_packed_float32_rows_past_one_row_block_keep_their_bits(weight_dtype: torch.dtype) -> None:
    # 2,048 inputs make a row block (x within 256 KiB) 28-30 rows: 100 rows take four blocks, each through every
    # panel (80 outputs: pairs and a last, odd panel on AVX-512) before the next block.
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(80, 2048, generator=gen).to(weight_dtype)
    x, bias = torch.randn(100, 2048, generator=gen), torch.randn(80, generator=gen)
    linear = kernels.float32_linear(weight, bias)
    together = linear(x)
    exact = F.linear(x.double(), weight.double(), bias.double())
    torch.testing.assert_close(together.double(), exact, rtol=1e-5, atol=1e-3)
    for row in (0, 29, 30, 57, 99):
        assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])
    assert torch.equal(linear(x[31:]), together[31:])


@needs_avx2_fma
def test_float32_layers_get_the_packed_linear_and_swiglu_and_other_shapes_keep_torch() -> None:
    from frame.layers import SwiGLUProjection

    torch.manual_seed(0)
    platform = CpuPlatform(CpuOptions())
    linear = Linear(32, 48, True, torch.device("cpu"), torch.float32)
    linear.weight.data.normal_()
    linear.bias.data.normal_()
    kernel = platform.layer_kernel(linear)
    x = torch.randn(3, 32)
    torch.testing.assert_close(kernel(x), F.linear(x, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    assert kernel(x.unsqueeze(0)) is None  # 3-D input: the layer's own torch path
    swiglu = SwiGLUProjection(32, 16, False, torch.device("cpu"), torch.float32)
    swiglu.weight.data.normal_()
    fused = platform.layer_kernel(swiglu)
    gate, up = F.linear(x, swiglu.weight).chunk(2, dim=-1)
    # The kernel's SiLU takes its own exp polynomial: unseeded draws once found an element 4e-5 away in relative terms.
    torch.testing.assert_close(fused(x), F.silu(gate) * up, rtol=1e-4, atol=1e-4)
    odd = Linear(32, 40, False, torch.device("cpu"), torch.float32)
    assert platform.layer_kernel(odd) is None
    assert CpuPlatform(CpuOptions(native_kernels=False)).layer_kernel(linear) is None


@needs_avx2_fma
@pytest.mark.parametrize("rows", [1, 3, 20])
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
def test_packed_float32_linears_run_as_a_team_with_the_plain_ops_bits(rows: int, weight_dtype: torch.dtype,
                                                                      runs_every_way) -> None:
    # A step program's stretch of two float32 linears (their `_into` forms, which a planned replay calls) runs as one
    # team, each thread taking its share of the panels: bound, from the arguments each run, or each call with its
    # own parallel region, the plain ops' bits every way.
    gen = torch.Generator().manual_seed(rows)
    first, second = (kernels.pack_weight_f32(torch.randn(64, 64, generator=gen).to(weight_dtype)) for _ in range(2))
    bias = torch.randn(64, generator=gen)
    x = torch.randn(rows, 64, generator=gen)
    hidden, out = torch.empty(rows, 64), torch.empty(rows, 64)
    expected = torch.ops.frame_cpu.packed_linear_f32(torch.ops.frame_cpu.packed_linear_f32(x, first, bias, 64),
                                                     second, None, 64)
    program = torch.classes.frame_cpu.StepProgram(0)
    program.call("frame_cpu::packed_linear_f32_into", "", [x, first, bias, 64, hidden], [-1] * 5, [])
    program.call("frame_cpu::packed_linear_f32_into", "", [hidden, second, None, 64, out], [-1] * 5, [])
    program.set_output(out, -1)
    assert program.num_teams() == (1 if torch.get_num_threads() > 1 else 0)
    assert program.num_bound() == 2 * program.num_teams()
    runs_every_way(program, out, expected)


@needs_avx2_fma
@pytest.mark.parametrize("rows", [1, 3])
def test_a_team_meets_only_where_another_thread_reads_or_wrote(rows: int, runs_every_way) -> None:
    # Two rotations the first thread runs alone (no binder: their direct form), between two shared linears: the
    # team meets after the first linear (the rotations read all of its columns) and before the second (which reads
    # the rotated rows), not between the rotations; the result is the plain ops' bits every way.
    gen = torch.Generator().manual_seed(rows)
    first, second = (kernels.pack_weight_f32(torch.randn(64, 64, generator=gen)) for _ in range(2))
    x, hidden, out = torch.randn(rows, 64, generator=gen), torch.empty(rows, 64), torch.empty(rows, 64)
    cos, sin = torch.randn(rows, 16, generator=gen), torch.randn(rows, 16, generator=gen)
    rotated = torch.ops.frame_cpu.packed_linear_f32(x, first, None, 64)
    for _ in range(2):
        torch.ops.frame_cpu.rotate_halves_(rotated.view(rows, 2, 32), cos, sin)  # two heads of 32
    expected = torch.ops.frame_cpu.packed_linear_f32(rotated, second, None, 64)
    program = torch.classes.frame_cpu.StepProgram(0)
    program.call("frame_cpu::packed_linear_f32_into", "", [x, first, None, 64, hidden], [-1] * 5, [])
    for _ in range(2):
        program.call("frame_cpu::rotate_halves_", "", [hidden.view(rows, 2, 32), cos, sin], [-1] * 3, [])
    program.call("frame_cpu::packed_linear_f32_into", "", [hidden, second, None, 64, out], [-1] * 5, [])
    program.set_output(out, -1)
    teamed = torch.get_num_threads() > 1
    assert program.num_barriers() == (2 if teamed else 0)
    if teamed:
        assert [line.split(" ", 1)[1] for line in program.describe()] == [
            "team bound shared barrier", "team alone", "team alone barrier", "team bound shared"]
    runs_every_way(program, out, expected)
