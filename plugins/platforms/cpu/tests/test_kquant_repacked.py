"""The K-quants (q4_K, q5_K, q6_K, q3_K, q2_K) and iq4_xs read repacked where the CPU has AVX-512 VNNI: each chunk of 32
of a super-block as a block of the ggml repacked layout (``repack.repack_q4_k``: its 6-bit sc and mn a byte each;
``repack_q6_k``: 6-bit values as nibbles and two bit planes; ``repack_q3_k``: two bits four to a byte and a plane of
the third; ``repack_q2_k``: the two bits so, ggml's sc and mn nibbles a byte; ``repack_iq4_xs``: iq4_nl's nibbles, an
int8 sc per chunk), x quantized per super-block as llama.cpp's q8_K, each super-block summed as the file-layout
kernel's portable path sums it (the same integers, the same float operations), so with its bits. That kernel
(``kquant``) stays the AVX2 and portable paths: test_kquant.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame.testing.ggml_blocks import random_blocks
from frame.weights import GGMLWeight
from frame_platform_cpu import kernels, kquant, quantized, repack

_WHY_NOT = kernels.unavailable_reason()
pytestmark = [
    pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}"),
    pytest.mark.skipif(_WHY_NOT is None and not quantized.has_vnni(),
                       reason="the K-quants are read repacked with AVX-512 VNNI"),
]
FORMATS = list(quantized.REPACKED_KQUANTS)


def quantized_inputs(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it for q4_K and q6_K (llama.cpp's q8_K): each super-block of 256 rounded to int8 steps of
    max|x| / 127 (half to even, as C++'s nearbyint), the step kept in float32, in float64."""
    blocks = x.float().reshape(x.shape[0], -1, 256)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))).double()
    return (q * (amax / 127).double()).reshape(x.shape)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
# 40: a last group of 16 padded; 200: sets of four groups and a last padded group alone; 97: a last group of one.
@pytest.mark.parametrize("out_features", [40, 200, 97])
def test_repacked_super_blocks_are_the_dequantised_product(fmt: str, rows: int, out_features: int) -> None:
    weight = random_blocks(fmt, out_features, 768, seed=out_features + rows)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 768, generator=torch.Generator().manual_seed(rows))
    kernel = quantized.ggml_linear(weight, bias)
    assert getattr(kernel, "own_copy", False)  # the repacked path, not the file's blocks
    y = kernel(x)
    dense = weight.dequantize().double()
    # Exact arithmetic on the rounded x: each chunk's integer products are summed exactly (q6_K's super-block as one
    # integer) and q4_K's d sc, dmin mn are exact in float32, so only float32 rounding of a few terms remains.
    torch.testing.assert_close(y.double(), quantized_inputs(x) @ dense.T + bias.double(), rtol=1e-5, atol=1e-4)
    # The portable path's bits: llama.cpp's integer sums and float order (the perplexity against llama.cpp's is that
    # sensitive to an ulp: docs/models.md).
    assert torch.equal(y, kquant.kquant_linear(weight, bias, portable=True)(x))
    # Against float32 x: rounding x to 255 levels per 256 inputs moves each product by at most max|x| / 254.
    loose = F.linear(x.double(), dense, bias.double())
    amax = x.abs().reshape(rows, -1, 256).amax(-1).double()
    bound = (amax / 254).repeat_interleave(256, dim=1) @ dense.abs().T
    assert ((y.double() - loose).abs() <= bound * 1.01 + 1e-4).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_lone_rows_have_their_batchs_bits(fmt: str, threads: int, torch_threads) -> None:
    # A lone row reads sets of four groups in step, a batch row tiles group by group: the same sums, bit for bit,
    # for every split of 1-10 groups over the threads.
    torch_threads(threads)
    for out_features in (*range(16, 161, 16), 97):
        linear = quantized.ggml_linear(random_blocks(fmt, out_features, 512, seed=out_features), None)
        x = torch.randn(5, 512, generator=torch.Generator().manual_seed(9)).bfloat16()
        together = linear(x)
        for row in (0, 2, 4):
            assert torch.equal(linear(x[row : row + 1]), together[row : row + 1]), out_features
        for rows in (slice(0, 2), slice(1, 4), slice(1, 5)):  # whole sets as one stream for 2-4 rows
            assert torch.equal(linear(x[rows]), together[rows]), out_features


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("threads", [1, 2])
def test_swiglu_is_the_product_then_the_activation(fmt: str, threads: int, torch_threads) -> None:
    # SwiGLU's [gate | up] in a super-block format runs the activation in the product's epilogue for bfloat16 x:
    # the bits of the product followed by silu_and_mul. 80 and 16: gate and up groups that share a set of four.
    torch_threads(threads)
    for intermediate in (80, 160, 16, 128):
        weight = random_blocks(fmt, 2 * intermediate, 256, seed=intermediate)
        layer = torch.nn.Linear(256, 2 * intermediate, bias=False)
        fused = quantized.packed_layer_kernel(layer, weight, gated=True)
        product = quantized.ggml_linear(weight, None)
        x = torch.randn(6, 256, generator=torch.Generator().manual_seed(4)).bfloat16()
        for rows in (x[:1], x[2:3], x[1:4], x):
            assert torch.equal(fused(rows), torch.ops.frame_cpu.silu_and_mul(product(rows))), intermediate


@pytest.mark.parametrize("rows", [1, 3, 20])
def test_repacked_super_blocks_run_as_a_team_with_the_plain_ops_bits(rows: int, runs_every_way) -> None:
    # A step program's stretch of a repacked q4_K linear and a q6_K one (their `_into` form) runs as one team: the
    # plain op's bits bound from records, from the arguments each run, or each call with its own parallel region.
    kernels.load()
    first = repack.repack_q4_k(random_blocks("q4_k", 256, 256, seed=0).tensors["blocks"])
    second = repack.repack_q6_k(random_blocks("q6_k", 48, 256, seed=1).tensors["blocks"])
    Q4_K, Q6_K = quantized.REPACKED_KQUANTS["q4_k"], quantized.REPACKED_KQUANTS["q6_k"]
    bias = torch.randn(48, generator=torch.Generator().manual_seed(2))
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    hidden, out = torch.empty(rows, 256, dtype=torch.bfloat16), torch.empty(rows, 48, dtype=torch.bfloat16)
    step = torch.ops.frame_cpu.ggml_linear_repacked(x, *first, Q4_K, 256, None)
    expected = torch.ops.frame_cpu.ggml_linear_repacked(step, *second, Q6_K, 48, bias)
    program = torch.classes.frame_cpu.StepProgram(0)
    program.call("frame_cpu::ggml_linear_repacked_into", "", [x, *first, Q4_K, 256, None, hidden], [-1] * 7, [])
    program.call("frame_cpu::ggml_linear_repacked_into", "", [hidden, *second, Q6_K, 48, bias, out], [-1] * 7, [])
    program.set_output(out, -1)
    assert program.num_bound() == 2 * program.num_teams()
    runs_every_way(program, out, expected)


def test_the_q4_k_record_holds_each_chunks_scales_and_the_halves() -> None:
    # One group, one super-block: the record's sc and mn bytes per chunk are ggml's get_scale_min_k4, and its last
    # 64 bytes the rows' d and dmin as the file holds them.
    weight = random_blocks("q4_k", 16, 256, seed=5)
    _, scales = repack.repack_q4_k(weight.tensors["blocks"])
    record = scales.reshape(-1).view(torch.uint8)
    blocks = weight.tensors["blocks"].reshape(16, 144)
    assert torch.equal(record[256:288].view(torch.float16), blocks[:, 0:2].contiguous().view(torch.float16).reshape(16))
    assert torch.equal(record[288:320].view(torch.float16), blocks[:, 2:4].contiguous().view(torch.float16).reshape(16))
    dense = weight.dequantize().double()  # d sc q - dmin mn: the scales recovered from the record give it back
    d = blocks[:, 0:2].contiguous().view(torch.float16).double().reshape(16, 1)
    dmin = blocks[:, 2:4].contiguous().view(torch.float16).double().reshape(16, 1)
    sc = record[:256].reshape(8, 2, 16)[:, 0].T.double()  # [rows, chunks]
    mn = record[:256].reshape(8, 2, 16)[:, 1].T.double()
    nibbles = blocks[:, 16:].reshape(16, 4, 32)
    q = torch.stack([nibbles & 0xF, nibbles >> 4], dim=2).reshape(16, 8, 32).double()
    rebuilt = (d * sc).unsqueeze(-1) * q - (dmin * mn).unsqueeze(-1)
    torch.testing.assert_close(rebuilt.reshape(16, 256), dense, rtol=0, atol=0)


def assert_offset_rebuild(u: torch.Tensor, scales: torch.Tensor, weight: GGMLWeight, offset: int) -> None:
    """One group's values u ``[block, row, input]`` and q6_K's record (per chunk of 16 its rows' int8 sc, then the
    rows' float16 d) rebuild the dequantised weight exactly: d sc_(v // 16) (u - offset)."""
    record = scales.reshape(-1).view(torch.uint8)
    sc = record[:256].view(torch.int8).reshape(16, 16).T.double()  # [row, chunk of 16]
    d = record[256:288].view(torch.float16).double().reshape(16, 1)
    values = u.permute(1, 0, 2).reshape(16, 256).double()  # [row, input]
    rebuilt = d * sc.repeat_interleave(16, dim=1) * (values - offset)
    torch.testing.assert_close(rebuilt, weight.dequantize().double(), rtol=0, atol=0)


def test_q6_k_repacked_values_and_record_give_back_the_dequantised_weight() -> None:
    # One group, one super-block: the nibbles of chunk c, bit planes 4 and 5 and the record's sc and d rebuild gguf's
    # dequantisation exactly: d sc_(v // 16) (u - 32).
    weight = random_blocks("q6_k", 16, 256, seed=6)
    qs, scales = repack.repack_q6_k(weight.tensors["blocks"])
    chunks = qs.reshape(8, 6, 16, 4)  # [block, chunk, row, byte t]
    nibbles = chunks[:, :4].permute(0, 2, 1, 3).reshape(8, 16, 16)  # [block, row, byte 4c + t]
    u = torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1).long()  # [block, row, input]: low nibble i, high 16 + i
    for plane, chunk in ((4, 4), (5, 5)):
        masks = chunks[:, chunk].reshape(8, 8, 8).view(torch.int64)[..., 0]  # [block, mask i]: bit 4j + t
        bits = (masks.unsqueeze(-1) >> torch.arange(64)) & 1  # [block, i, 4j + t]
        bits = bits.reshape(8, 8, 16, 4).permute(0, 2, 1, 3).reshape(8, 16, 32)  # [block, row, input 4i + t]
        u = u | (bits << plane)
    assert_offset_rebuild(u, scales, weight, 32)


def test_q3_k_repacked_values_and_record_give_back_the_dequantised_weight() -> None:
    # One group, one super-block: chunk c's bits 2p of byte t (input 4 (4c + p) + t), the third chunk's masks of bit 2
    # and the record's sc and d rebuild gguf's dequantisation exactly: d sc_(v // 16) (u - 4).
    weight = random_blocks("q3_k", 16, 256, seed=7)
    qs, scales = repack.repack_q3_k(weight.tensors["blocks"])
    chunks = qs.reshape(8, 3, 16, 4).long()  # [block, chunk, row, byte t]
    crumbs = torch.stack([(chunks[:, :2] >> (2 * p)) & 3 for p in range(4)], dim=2)  # [block, c, p, row, t]
    u = crumbs.permute(0, 3, 1, 2, 4).reshape(8, 16, 32)  # [block, row, input 16c + 4p + t]
    masks = chunks[:, 2].to(torch.uint8).reshape(8, 8, 8).view(torch.int64)[..., 0]  # [block, mask i]: bit 4j + t
    bits = (masks.unsqueeze(-1) >> torch.arange(64)) & 1
    u = u | (bits.reshape(8, 8, 16, 4).permute(0, 2, 1, 3).reshape(8, 16, 32) << 2)
    assert_offset_rebuild(u, scales, weight, 4)


def test_q2_k_repacked_values_and_record_give_back_the_dequantised_weight() -> None:
    # One group, one super-block: the two chunks of 2-bit values and the record's sc / mn nibbles, d and dmin rebuild
    # gguf's dequantisation exactly: d sc_(v // 16) u - dmin mn_(v // 16).
    weight = random_blocks("q2_k", 16, 256, seed=8)
    qs, scales = repack.repack_q2_k(weight.tensors["blocks"])
    chunks = qs.reshape(8, 2, 16, 4).long()  # [block, chunk, row, byte t]
    crumbs = torch.stack([(chunks >> (2 * p)) & 3 for p in range(4)], dim=2)  # [block, c, p, row, t]
    values = crumbs.permute(3, 0, 1, 2, 4).reshape(16, 256).double()  # [row, input 32 block + 16c + 4p + t]
    record = scales.reshape(-1).view(torch.uint8)
    packed = record[:256].reshape(16, 16).T.long()  # [row, chunk of 16]
    d, dmin = record[256:320].view(torch.float16).double().reshape(2, 16, 1)
    sc, mn = (packed & 0xF).double().repeat_interleave(16, dim=1), (packed >> 4).double().repeat_interleave(16, dim=1)
    rebuilt = d * sc * values - dmin * mn
    torch.testing.assert_close(rebuilt, weight.dequantize().double(), rtol=0, atol=0)


def test_iq4_xs_repacked_values_and_record_give_back_the_dequantised_weight() -> None:
    # One group, one super-block: iq4_nl's nibbles of chunk c through the 16 levels, the record's int8 sc per chunk and
    # d rebuild gguf's dequantisation exactly: d sc_c kvalues_iq4nl[nibble].
    weight = random_blocks("iq4_xs", 16, 256, seed=9)
    qs, scales = repack.repack_iq4_xs(weight.tensors["blocks"])
    nibbles = qs.reshape(8, 4, 16, 4).permute(0, 2, 1, 3).reshape(8, 16, 16).long()  # [block, row, byte 4c + t]
    levels = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
    values = levels[torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1)].permute(1, 0, 2).reshape(16, 256).double()
    record = scales.reshape(-1).view(torch.uint8)
    sc = record[:128].view(torch.int8).reshape(8, 16).T.double().repeat_interleave(32, dim=1)  # [row, input]
    d = record[128:160].view(torch.float16).double().reshape(16, 1)
    torch.testing.assert_close(d * sc * values, weight.dequantize().double(), rtol=0, atol=0)


@pytest.mark.parametrize("fmt", [*FORMATS, "q4_1"])
def test_a_large_weight_is_repacked_in_slices_with_the_whole_ones_bytes(fmt: str, monkeypatch) -> None:
    # 200 rows repacked 64 at a time (a last slice of 8 rows, padded): the same tensors as in one piece.
    weight = (random_blocks(fmt, 200, 256, seed=3) if fmt in FORMATS
              else GGMLWeight.quantized(fmt, torch.randn(200, 256, generator=torch.Generator().manual_seed(3))))
    code = {**quantized.GGML_FORMATS, **quantized.REPACKED_KQUANTS}[fmt]
    whole = repack.repack_by_rows(weight.tensors["blocks"], code)
    monkeypatch.setattr(repack, "_REPACK_ROWS", 64)
    sliced = repack.repack_by_rows(weight.tensors["blocks"], code)
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(whole, sliced, strict=True))
