"""The cpu platform's kernels for ggml's super-blocks of 256 (q4_K, q6_K, q3_K, q2_K, q5_K, iq4_xs), run on the
file's own blocks by the AVX-512 VNNI, AVX2 and portable paths, against gguf's own (numpy) dequantisation.

gguf-py does not quantize these types, so the blocks are random bytes with sane float16 scales: every bit pattern
of a block is a valid block, and gguf's ``dequantize`` says what it means. ``FRAME_CPU_DISABLE=avx512_vnni`` or
``=avx2`` makes this machine stand in for the lesser classes (the paths this CPU lacks are skipped)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame.testing.ggml_blocks import random_blocks
from frame.weights import GGMLWeight, MixedRows
from frame_platform_cpu import kernels, kquant, quantized

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")
PATHS = [pytest.param({"portable": True}, id="portable"),
         pytest.param({"portable": False, "vnni": False}, id="avx2",
                      marks=pytest.mark.skipif(kquant.isa_path() == "portable", reason="no AVX2, FMA and F16C")),
         pytest.param({"portable": False, "vnni": True}, id="avx512_vnni",
                      marks=pytest.mark.skipif(kquant.isa_path() != "avx512_vnni", reason="no AVX-512 VNNI and BW"))]
FORMATS = list(kquant.KQUANT_FORMATS)

def quantized_inputs(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it: each super-block of 256 rounded to int8 steps of max|x| / 127 (half to even, as
    C++'s nearbyint), in float64."""
    blocks = x.float().reshape(x.shape[0], -1, 256)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inverse).double()
    return (q * (amax / 127).double()).reshape(x.shape)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
# 1: a lone output row; 37: an odd count that splits unevenly over the threads.
@pytest.mark.parametrize("out_features", [1, 37])
def test_each_type_is_its_dequantised_product(fmt: str, rows: int, out_features: int, path: dict) -> None:
    inputs = 768  # three super-blocks a row
    weight = random_blocks(fmt, out_features, inputs, seed=out_features + rows)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows))
    kernel = kquant.kquant_linear(weight, bias, **path)
    assert kernel is not None
    y = kernel(x)
    dense = weight.dequantize().double()
    # Exact arithmetic on the int8-rounded x: each super-block's integer products are summed exactly, so only
    # float32 rounding of a few per-super-block terms and their sum remains.
    exact = quantized_inputs(x) @ dense.T + bias.double()
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-4)
    # Against float32 x: rounding x to 255 levels per 256 inputs moves each product by at most max|x| / 254.
    loose = F.linear(x.double(), dense, bias.double())
    amax = x.abs().reshape(rows, -1, 256).amax(-1).double()  # [rows, super-blocks]
    bound = (amax / 254).repeat_interleave(256, dim=1) @ dense.abs().T
    assert ((y.double() - loose).abs() <= bound * 1.01 + 1e-4).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_paths_agree_and_rows_do_not_depend_on_their_batch(fmt: str) -> None:
    weight = random_blocks(fmt, 50, 1536, seed=4)
    x = torch.randn(6, 1536, generator=torch.Generator().manual_seed(5))
    plain = kquant.kquant_linear(weight, None, portable=True)(x)
    for path in PATHS[1:]:
        if any(mark.args[0] for mark in path.marks):  # a path this CPU lacks
            continue
        linear = kquant.kquant_linear(weight, None, **path.values[0])
        together = linear(x)
        torch.testing.assert_close(together, plain, rtol=1e-5, atol=1e-4)  # only float32 summation order differs
        for row in (0, 5):  # a lone row runs the same tile of one, so the same sums bit for bit
            assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])


@pytest.mark.parametrize("path", PATHS)
def test_a_prefill_taken_in_blocks_of_rows_gives_each_tiles_sums(path: dict) -> None:
    # 150 rows of 8,192 inputs: five blocks of 32 quantized rows (256 KiB each), the last one partial. Every tile of
    # eight rows (four on the AVX2 and portable paths) is the tile it would be alone, so the same sums bit for bit.
    weight = random_blocks("q4_k", 24, 8192, seed=7)
    x = torch.randn(150, 8192, generator=torch.Generator().manual_seed(8)).bfloat16()
    linear = kquant.kquant_linear(weight, None, **path)
    together = linear(x)
    assert torch.equal(together, torch.cat([linear(x[r : r + 8]) for r in range(0, 150, 8)]))
    exact = quantized_inputs(x) @ weight.dequantize().double().T
    # bfloat16 outputs: within a rounding step of the largest.
    torch.testing.assert_close(together.double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ["q6_k", "q3_k"])
def test_an_outlier_input_keeps_the_offset_formats_exact(fmt: str, path: dict) -> None:
    # A BOS position's down-projection input: one value in the thousands beside values near 1 (SmolLM2's reach
    # 2,615). q6_K's and q3_K's offsets (u - 32, u - 4) must cancel in the super-block's integer sum on every path:
    # summed as float lanes they left up to 7e-6 of sum(|w| |x|) on the vector paths, 40x the portable path's and
    # llama.cpp's error, and moved a Q5_K_M file's perplexity against llama.cpp's by a percent.
    weight = random_blocks(fmt, 64, 1536, seed=11)
    x = torch.randn(9, 1536, generator=torch.Generator().manual_seed(12)) * 0.5
    x[:, 300] = 2615.0
    y = kquant.kquant_linear(weight, None, **path)(x)
    dense = weight.dequantize().double()
    exact = quantized_inputs(x) @ dense.T
    assert ((y.double() - exact).abs() <= 5e-7 * (quantized_inputs(x).abs() @ dense.abs().T)).all()


@pytest.mark.parametrize("path", PATHS)
def test_bfloat16_rows_come_back_bfloat16(path: dict) -> None:
    weight = random_blocks("q4_k", 32, 512)
    xb = torch.randn(5, 512, generator=torch.Generator().manual_seed(3)).bfloat16()
    y = kquant.kquant_linear(weight, None, **path)(xb)
    assert y.dtype == torch.bfloat16
    exact = quantized_inputs(xb.float()) @ weight.dequantize().double().T
    torch.testing.assert_close(y.double(), exact, rtol=2**-8, atol=1e-3)


def test_the_weight_is_read_in_place() -> None:
    # The kernel keeps the file's blocks (a memory-mapped tensor in a real load), not a copy: changing them
    # changes the product. (Where the CPU has AVX-512 VNNI, quantized.ggml_linear reads the K-quants repacked
    # instead: test_kquant_repacked.)
    weight = random_blocks("iq4_xs", 16, 256)
    kernel = kquant.kquant_linear(weight, None)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1))
    before = kernel(x)
    weight.tensors["blocks"][:, 8:136] ^= 0x11  # some of iq4_xs's nibbles
    assert not torch.equal(kernel(x), before)
    exact = quantized_inputs(x) @ weight.dequantize().double().T
    torch.testing.assert_close(kernel(x).double(), exact, rtol=1e-5, atol=1e-4)


def test_a_weight_mixing_types_runs_each_part_in_its_own() -> None:
    # A fused QKV of a Q4_K_M file: q4_K Q and K beside a q6_K V (and blocks of 32), each part its own kernel.
    dense = torch.randn(56, 512, generator=torch.Generator().manual_seed(2))
    parts = [random_blocks("q4_k", 64, 512, seed=1), GGMLWeight.quantized("q5_0", dense[:16]),
             random_blocks("q6_k", 48, 512, seed=3), GGMLWeight.quantized("q8_0", dense[16:])]
    mixed = MixedRows(parts)
    layer = torch.nn.Module()
    layer.bias = torch.randn(168, generator=torch.Generator().manual_seed(5))
    kernel = quantized.packed_layer_kernel(layer, mixed, gated=False)
    assert kernel is not None
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(6))
    by_part = torch.cat([quantized.ggml_linear(p, None)(x) for p in parts], dim=-1) + layer.bias
    assert torch.equal(kernel(x), by_part)
    exact = torch.cat([kquant.kquant_linear(p, None, portable=True)(x) if p.format in kquant.KQUANT_FORMATS
                       else quantized.ggml_linear(p, None, portable=True)(x) for p in parts], dim=-1)
    torch.testing.assert_close(kernel(x), exact + layer.bias, rtol=1e-5, atol=1e-4)


def test_every_type_is_served_with_its_path() -> None:
    from frame_platform_cpu.platform import CpuPlatform

    paths = CpuPlatform().kernel_paths()  # what the engine prints at start
    for fmt in FORMATS:
        assert fmt in quantized.served_formats()
        assert paths[fmt] == kquant.isa_path()


def test_the_kernel_declines_other_inputs() -> None:
    weight = random_blocks("q4_k", 16, 256)
    kernel = kquant.kquant_linear(weight, None)
    assert kernel(torch.zeros(2, 3, 256)) is None
    assert kernel(torch.zeros(2, 256, dtype=torch.float64)) is None
    assert kquant.kquant_linear(GGMLWeight("q4_0", torch.zeros(16, 18, dtype=torch.uint8), 32), None) is None



@pytest.mark.parametrize("rows", [1, 3, 20])
def test_kquant_products_run_as_a_team_with_the_plain_ops_bits(rows: int, runs_every_way) -> None:
    # Two K-quant linears in a row (their `_into` form, which a planned replay calls) run in a step program as one
    # team: each thread quantizes x (a lone row for itself, more rows a share each into the team's scratch), then
    # takes its columns. Bound from records, from the arguments each run, or each call with its own parallel
    # region: the plain op's bits every way, on every path this CPU runs.
    kernels.load()
    first = random_blocks("q4_k", 256, 256, 0).tensors["blocks"]
    second = random_blocks("q6_k", 48, 256, 1).tensors["blocks"]
    q4_k, q6_k = kquant.KQUANT_FORMATS["q4_k"], kquant.KQUANT_FORMATS["q6_k"]
    bias = torch.randn(48, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    for path in range(int(torch.ops.frame_cpu.kquant_best_path()) + 1):
        hidden = torch.empty(rows, 256, dtype=torch.bfloat16)
        out = torch.empty(rows, 48, dtype=torch.bfloat16)
        step = torch.ops.frame_cpu.kquant_linear(x, first, q4_k, None, path)
        expected = torch.ops.frame_cpu.kquant_linear(step, second, q6_k, bias, path)
        program = torch.classes.frame_cpu.StepProgram(0)
        program.call("frame_cpu::kquant_linear_into", "", [x, first, q4_k, None, path, hidden], [-1] * 6, [])
        program.call("frame_cpu::kquant_linear_into", "", [hidden, second, q6_k, bias, path, out], [-1] * 6, [])
        program.set_output(out, -1)
        assert program.num_bound() == 2 * program.num_teams()
        runs_every_way(program, out, expected, path)
