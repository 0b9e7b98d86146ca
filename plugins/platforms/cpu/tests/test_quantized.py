"""The cpu platform's kernels for packed ggml blocks of 32, the repacked (AVX-512 VNNI or AVX2), AVX2 and portable
paths, against gguf's own dequantisation: q4_0, q4_1, q8_0, q5_0, q5_1 and iq4_nl (the super-block formats:
test_kquant.py).

gguf-py quantizes only q4_0, q4_1, q5_0, q5_1 and q8_0, so iq4_nl's blocks here are random bytes with sane float16
scales: every bit pattern of a block is a valid block, and gguf's ``dequantize`` says what it means."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame.testing.ggml_blocks import random_blocks
from frame.weights import GGMLWeight, MixedRows
from frame_platform_cpu import kernels, kquant, probe, quantized, repack

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")
PATHS = [pytest.param({"portable": True}, id="portable"),
         pytest.param({"portable": False, "vnni": False}, id="avx2",
                      marks=pytest.mark.skipif(not probe.has_avx2_fma(), reason="no AVX2 and FMA")),
         pytest.param({"portable": False, "vnni": True}, id="repacked",
                      marks=pytest.mark.skipif(not quantized.has_repacked(), reason="no AVX2 or AVX-512 VNNI"))]
NO_REPACKED = "the repacked kernel needs AVX2 or AVX-512 VNNI"


def packed(fmt: str, rows: int, inputs: int, seed: int = 0) -> GGMLWeight:
    return GGMLWeight.quantized(fmt, torch.randn(rows, inputs, generator=torch.Generator().manual_seed(seed)))


def rounded_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x per block of 32 as llama.cpp's q8_0 / q8_1 round it: int8 steps q of d_x = max|x| / 127 (x times 127 /
    max|x| in float32, half to even as C++'s nearbyint), and d_x in float32 ``[rows, blocks, 1]``."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return torch.round(blocks * inverse), amax / 127


def quantized_inputs(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it (q8_0): q d_x with d_x kept as float16, as llama.cpp's blocks keep it, in float64."""
    q, scale = rounded_blocks(x)
    return (q.double() * scale.half().double()).reshape(x.shape)


def llama_cpp_product(x: torch.Tensor, weight: GGMLWeight) -> torch.Tensor:
    """``x W^T`` exactly as llama.cpp's dot products define it, in float64: x as :func:`quantized_inputs`, and for a
    weight with a min (q4_1, q5_1) the min times q8_1's s_x = float16(d_x sum(q_x)), with d_x before its rounding."""
    y = quantized_inputs(x) @ weight.dequantize().double().T
    if weight.format in ("q4_1", "q5_1"):
        q, scale = rounded_blocks(x)
        sums = q.sum(-1)  # [rows, blocks]
        s_x = (scale.squeeze(-1) * sums).half().double()
        nb = weight.in_features // 32
        mins = weight.tensors["blocks"].reshape(-1, nb, 20 if weight.format == "q4_1" else 24)[..., 2:4]
        m = mins.contiguous().view(torch.float16).reshape(-1, nb).double()
        y = y + (s_x - scale.squeeze(-1).half().double() * sums.double()) @ m.T
    return y


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9, 17])
# 40: the VNNI layout's last group of 16 is padded; 200: one row takes 13 groups as three sets of four in step
# (group_set_vnni) and a last, padded group alone; 97: a last group of one row (the tied LM head of the family
# suite's tiny models, whose Gemma 3 case amplifies this rounding: frame.testing.gguf.int8_activation_logits).
@pytest.mark.parametrize("out_features", [48, 40, 200, 97])
def test_ggml_linear_is_the_dequantised_product(fmt: str, rows: int, out_features: int, portable: dict) -> None:
    weight = packed(fmt, out_features, 96)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1))
    kernel = quantized.ggml_linear(weight, bias, **portable)
    y = kernel(x)
    dense = weight.dequantize().double()
    # Exact arithmetic on the int8-rounded x: the kernel sums each block's 32 integer products exactly, so only
    # float32 rounding of the per-block terms and their sum (96 inputs: 3 blocks) remains, ~1e-6 of the scale.
    exact = llama_cpp_product(x, weight) + bias.double()
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
    exact = llama_cpp_product(xb.float(), weight)
    torch.testing.assert_close(y.double(), exact, rtol=2**-8, atol=1e-3)


def test_paths_agree_on_a_large_weight() -> None:
    if not probe.has_avx2_fma():
        pytest.skip("no AVX2 and FMA: only the portable path runs here")
    weight = packed("q4_1", 200, 576, seed=4)
    x = torch.randn(6, 576, generator=torch.Generator().manual_seed(5))
    plain = quantized.ggml_linear(weight, None, portable=True)(x)
    for vnni in (False, True) if quantized.has_repacked() else (False,):
        fast = quantized.ggml_linear(weight, None, portable=False, vnni=vnni)(x)
        torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-4)  # only the order of float32 block sums differs


@pytest.mark.skipif(not quantized.has_repacked(), reason=NO_REPACKED)
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repacked_rows_do_not_depend_on_their_batch(fmt: str, dtype: torch.dtype) -> None:
    # A lone row takes the decode loop (groups in step), a batch the row tiles: the same sums, bit for bit.
    weight = packed(fmt, 200, 576, seed=6)
    bias = torch.randn(200, generator=torch.Generator().manual_seed(8))
    linear = quantized.ggml_linear(weight, bias, vnni=True)
    x = torch.randn(11, 576, generator=torch.Generator().manual_seed(7)).to(dtype)
    together = linear(x)
    for row in (0, 3, 4, 10):
        assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])


def test_repacked_sets_hold_their_groups_blocks_side_by_side(monkeypatch) -> None:
    # Six groups of 16 rows, three blocks each: set 0 holds groups 0-3 and set 1 groups 4-5, each block-major (block
    # b of the set's groups side by side, then b + 1) in the bytes its groups would fill one after the other.
    blocks = packed("q5_1", 96, 96).tensors["blocks"]
    qs, scales = repack.repack_blocks(blocks, quantized.GGML_FORMATS["q5_1"])
    monkeypatch.setattr(repack, "SET_GROUPS", 1)  # sets of one group: group-major, each group's blocks in turn
    by_group = repack.repack_blocks(blocks, quantized.GGML_FORMATS["q5_1"])
    for packed_, group_major in zip((qs, scales), by_group, strict=True):
        assert packed_.shape == group_major.shape
        rows, reference = packed_.reshape(18, -1), group_major.reshape(6, 3, -1)
        for first, count in ((0, 4), (4, 2)):
            for b in range(3):
                for i in range(count):
                    assert torch.equal(rows[first * 3 + b * count + i], reference[first + i, b])


@pytest.mark.skipif(not quantized.has_repacked(), reason=NO_REPACKED)
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q5_1"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_repacked_lone_row_takes_any_number_of_groups(fmt: str, threads: int, torch_threads) -> None:
    # A thread's share of a lone row's groups runs four at a time and the last 1-3 together, each set asking ahead
    # for the next one's weight: every split of 1-10 groups (the last padded) gives the batched row's bits.
    torch_threads(threads)
    for out_features in (*range(16, 161, 16), 97):
        weight = packed(fmt, out_features, 192, seed=out_features)
        linear = quantized.ggml_linear(weight, None, vnni=True)
        x = torch.randn(5, 192, generator=torch.Generator().manual_seed(9)).bfloat16()
        together = linear(x)
        assert torch.equal(linear(x[2:3]), together[2:3]), out_features
        # 2-4 rows read whole sets as one stream and the groups around them alone (VNNI): the same bits again.
        assert torch.equal(linear(x[1:3]), together[1:3]), out_features
        assert torch.equal(linear(x[1:5]), together[1:5]), out_features


@pytest.mark.skipif(not quantized.has_repacked(), reason=NO_REPACKED)
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q5_1"])
@pytest.mark.parametrize("threads", [1, 2])
def test_repacked_swiglu_is_the_product_then_the_activation(fmt: str, threads: int, torch_threads) -> None:
    # SwiGLU's [gate | up] projection runs the activation in the product's epilogue for bfloat16 x with AVX-512
    # (with AVX2 the product, then silu_and_mul): the same bits as the product followed by silu_and_mul, for a lone
    # row (gate and up groups in sets) and for row tiles.
    torch_threads(threads)
    for intermediate, with_bias in ((80, True), (160, False), (16, True), (128, False)):
        weight = packed(fmt, 2 * intermediate, 192, seed=intermediate)
        bias = torch.randn(2 * intermediate, generator=torch.Generator().manual_seed(3)) if with_bias else None
        layer = torch.nn.Linear(192, 2 * intermediate, bias=with_bias)
        if bias is not None:
            layer.bias.data = bias
        fused = quantized.packed_layer_kernel(layer, weight, gated=True)
        product = quantized.ggml_linear(weight, layer.bias)
        x = torch.randn(6, 192, generator=torch.Generator().manual_seed(4)).bfloat16()
        for rows in (x[:1], x[2:3], x[1:4], x):
            expected = torch.ops.frame_cpu.silu_and_mul(product(rows))
            out = fused(rows)
            assert out.shape == (rows.shape[0], intermediate) and torch.equal(out, expected), intermediate
        # float32 rows keep the product and torch's activation
        gate, up = product(x.float()).chunk(2, dim=-1)
        torch.testing.assert_close(fused(x.float()), torch.nn.functional.silu(gate) * up)


NATIVE = ["q5_0", "q5_1", "iq4_nl"]


@pytest.mark.parametrize("portable", PATHS)
@pytest.mark.parametrize("fmt", NATIVE)
@pytest.mark.parametrize("rows", [1, 4, 5])
# 40: the VNNI layout's last group of 16 is padded; 200: one row takes groups four at a time and a padded one.
@pytest.mark.parametrize("out_features", [40, 200])
def test_each_type_is_its_dequantised_product(fmt: str, rows: int, out_features: int, portable: dict) -> None:
    weight = random_blocks(fmt, out_features, 512, seed=out_features + rows)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
    y = quantized.ggml_linear(weight, bias, **portable)(x)
    # Exact arithmetic on the int8-rounded x: each block's 32 integer products are summed exactly, so only float32
    # rounding of 16 per-block terms and their sum remains.
    exact = llama_cpp_product(x, weight) + bias.double()
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-4)
    # Against gguf's dequantisation of the file's blocks and float32 x: x's rounding to 255 levels a block moves a
    # product by at most max|x_block| / 254 of |w|: far less than 2% of sum(|w| |x|).
    dense = weight.dequantize().double()
    loose = F.linear(x.double(), dense, bias.double())
    assert ((y.double() - loose).abs() <= 0.02 * (x.double().abs() @ dense.abs().T) + 1e-6).all()


@pytest.mark.parametrize("fmt", ["q5_0", "q5_1"])
def test_gguf_quantized_5_bit_weights_run_close_to_float(fmt: str) -> None:
    # Blocks as gguf's (and llama.cpp's) quantizer writes them, from a float weight.
    dense = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 0.02
    weight = GGMLWeight.quantized(fmt, dense)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4))
    for portable in PATHS:
        if any(mark.args[0] for mark in portable.marks):  # a path this CPU lacks
            continue
        y = quantized.ggml_linear(weight, None, **portable.values[0])(x)
        exact = llama_cpp_product(x, weight)
        torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["q5_0", "iq4_nl", "q4_k", "q6_k"])
def test_parts_of_one_format_run_as_one_kernel_over_their_rows_joined(fmt: str) -> None:
    # A fused gate-up of one type arrives as its parts (views of the file): the kernel joins them for itself and
    # computes exactly what the joined weight's kernel, and each part's, computes.
    parts = [random_blocks(fmt, 48, 512, seed=7), random_blocks(fmt, 40, 512, seed=8)]
    layer = torch.nn.Module()
    layer.bias = None
    kernel = quantized.packed_layer_kernel(layer, MixedRows(parts), gated=False)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(9))
    joined = quantized.ggml_linear(GGMLWeight.cat(parts), None)
    assert kernel is not None and joined is not None
    assert torch.equal(kernel(x), joined(x))
    assert torch.equal(kernel(x), torch.cat([quantized.ggml_linear(p, None)(x) for p in parts], dim=-1))


def test_every_type_is_served_and_named_with_its_path() -> None:
    from frame_platform_cpu.platform import CpuPlatform

    paths = CpuPlatform().kernel_paths()  # what the engine prints at start
    for fmt in NATIVE:
        assert fmt in quantized.served_formats()
        assert paths[fmt] == quantized.isa_path()
    for fmt in kquant.KQUANT_FORMATS:  # the super-block formats run on the file's blocks (test_kquant.py)
        assert paths[fmt] == kquant.isa_path()


def test_repacked_decode_rows_match_batched_rows_for_new_formats() -> None:
    if not quantized.has_repacked():
        pytest.skip(NO_REPACKED)
    for fmt in NATIVE:
        weight = random_blocks(fmt, 200, 576, seed=6)
        linear = quantized.ggml_linear(weight, None, vnni=True)
        x = torch.randn(6, 576, generator=torch.Generator().manual_seed(7))
        together = linear(x)
        for row in (0, 5):
            assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])


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


@pytest.mark.skipif(not quantized.has_repacked(), reason=NO_REPACKED)
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 3, 20])
def test_repacked_products_run_as_a_team_with_the_plain_ops_bits(fmt: str, rows: int, runs_every_way) -> None:
    # A step program's stretch of a repacked linear and a SwiGLU (their `_into` forms, which a planned replay calls;
    # with AVX2, which has no SwiGLU epilogue, a second linear) runs as one team: each thread quantizes x (a lone row
    # for itself, more rows a share each into the team's scratch), then takes its groups. Bound from records, from
    # the arguments each run, or each call with its own parallel region: the plain ops' bits every way.
    kernels.load()
    code = quantized.GGML_FORMATS[fmt]
    qs, scales = repack.repack_blocks(packed(fmt, 64, 64).tensors["blocks"], code)
    gate_qs, gate_scales = repack.repack_blocks(packed(fmt, 64, 64, seed=1).tensors["blocks"], code)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    gated = quantized.has_vnni()
    hidden, out = torch.empty(rows, 64, dtype=torch.bfloat16), torch.empty(rows, 32 if gated else 64,
                                                                           dtype=torch.bfloat16)
    linear = torch.ops.frame_cpu.ggml_linear_repacked(x, qs, scales, code, 64, bias)
    second = ("ggml_swiglu_repacked", 32) if gated else ("ggml_linear_repacked", 64)
    expected = getattr(torch.ops.frame_cpu, second[0])(linear, gate_qs, gate_scales, code, second[1], None)
    program = torch.classes.frame_cpu.StepProgram(0)
    program.call("frame_cpu::ggml_linear_repacked_into", "", [x, qs, scales, code, 64, bias, hidden], [-1] * 7, [])
    program.call(f"frame_cpu::{second[0]}_into", "", [hidden, gate_qs, gate_scales, code, second[1], None, out],
                 [-1] * 7, [])
    program.set_output(out, -1)
    assert program.num_teams() == (1 if torch.get_num_threads() > 1 else 0)
    assert program.num_bound() == 2 * program.num_teams()
    runs_every_way(program, out, expected)
