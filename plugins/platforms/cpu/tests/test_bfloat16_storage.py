"""bfloat16 on CPUs without a bfloat16 dot product (AVX2, and AVX-512 without BF16): weights stored bfloat16,
every product and sum in float32 in the packed linear; the platform offers bfloat16 there and says which path
serves it. Paths this CPU cannot execute skip with the reason; the choice of path per CPU class is checked with
the flags of other CPUs (a test double for hardware this machine may lack)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame.layers import Linear, RMSNorm, SwiGLUProjection
from frame_platform_cpu import kernels, probe
from frame_platform_cpu.platform import CpuPlatform

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")
needs_avx2_fma = pytest.mark.skipif(not probe.has_avx2_fma(), reason="the packed float32 kernel needs AVX2 and FMA")
storage_only = pytest.mark.skipif(probe.bf16_path() not in probe.STORAGE_PATHS, reason=(
    f"this CPU's bfloat16 path is {probe.bf16_path()}, not storage-only AVX-512 or AVX2 (it has a bfloat16 dot "
    "product, or no AVX2; FRAME_CPU_DISABLE=avx512_bf16 stands in for such a CPU)"))

CPU_CLASSES = {  # /proc/cpuinfo flags of each class, the parts that decide
    "zen4_avx512_bf16": ({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"}, "avx512_bf16",
                         torch.bfloat16),
    "xeon_avx512_vnni": ({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}, "avx512",
                         torch.bfloat16),
    "xeon_phi_avx512f_only": ({"avx2", "fma", "avx512f"}, "avx2", torch.float32),  # no BW/VL: the AVX2 loops
    "zen3_avx2": ({"avx2", "fma", "f16c"}, "avx2", torch.float32),
    "sapphire_rapids_amx": ({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16"},
                            "avx512_bf16", torch.bfloat16),
    "graviton3_arm_bf16": ({"asimd", "bf16"}, "native", torch.float32),
    "arm_neon": ({"asimd"}, "neon", torch.float32),
    "old_x86": ({"sse4_2"}, None, torch.float32),
}


def _exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("cpu", list(CPU_CLASSES))
def test_each_cpu_class_gets_its_bfloat16_path_and_auto_dtype(cpu: str, monkeypatch: pytest.MonkeyPatch) -> None:
    flags, path, auto = CPU_CLASSES[cpu]
    monkeypatch.setattr(probe, "cpu_flags", lambda: frozenset(flags))
    assert probe.bf16_path() == path
    platform = CpuPlatform()
    assert (torch.bfloat16 in platform.supported_dtypes) == (path is not None)
    assert platform.default_dtype == auto


@needs_avx2_fma
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_weights_float32_rows_are_the_exact_product(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 200, generator=gen), torch.randn(96, 200, generator=gen).bfloat16()
    bias = torch.randn(96, generator=gen) if with_bias else None
    got = kernels.float32_linear(weight, bias)(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 96)
    # The weights widen exactly; only float32 summation over 200 inputs remains.
    torch.testing.assert_close(got.double(), _exact(x, weight, bias), rtol=1e-5, atol=1e-4)


@needs_avx2_fma
@pytest.mark.parametrize("rows", [1, 6, 9, 64])
def test_bfloat16_rows_come_back_rounded_once(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x, weight = torch.randn(rows, 576, generator=gen).bfloat16(), torch.randn(192, 576, generator=gen).bfloat16()
    bias = torch.randn(192, generator=gen).bfloat16()
    got = kernels.float32_linear(weight, bias)(x)
    assert got.dtype == torch.bfloat16
    # A float32 sum rounded to bfloat16 once: the exact value rounded to bfloat16, or a neighbour within float32's
    # summation error.
    exact = _exact(x, weight, bias)
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3).all()
    assert (got == exact.bfloat16()).float().mean() > 0.97


@needs_avx2_fma
@pytest.mark.parametrize("out_features", [16, 80, 96, 112])  # one panel; pairs and a last, odd panel; pairs only
@pytest.mark.parametrize("rows", [1, 7, 14, 15])
def test_bfloat16_weights_give_the_bits_of_the_same_weights_widened_to_float32(out_features: int, rows: int) -> None:
    # On AVX-512 a bfloat16 weight's panels hold two columns a lane and widen by a shift and an AND; a float32
    # weight's do not. The sums are the same, in the same order, so the outputs must be the same bits.
    gen = torch.Generator().manual_seed(out_features + rows)
    x, weight = torch.randn(rows, 72, generator=gen), torch.randn(out_features, 72, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen)
    got = kernels.float32_linear(weight, bias)(x)
    assert torch.equal(got, kernels.float32_linear(weight.float(), bias)(x))
    torch.testing.assert_close(got.double(), _exact(x, weight, bias), rtol=1e-5, atol=1e-4)


@needs_avx2_fma
def test_bfloat16_rows_do_not_depend_on_their_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    linear = kernels.float32_linear(torch.randn(64, 96, generator=gen).bfloat16(), None)
    x = torch.randn(20, 96, generator=gen).bfloat16()
    together = linear(x)
    for row in (0, 5, 6, 19):
        assert torch.equal(linear(x[row : row + 1]), together[row : row + 1])


@needs_avx2_fma
def test_bfloat16_kernel_declines_other_inputs() -> None:
    linear = kernels.float32_linear(torch.randn(32, 64).bfloat16(), None)
    assert linear(torch.zeros(2, 64, dtype=torch.float64)) is None
    assert linear(torch.zeros(2, 3, 64, dtype=torch.bfloat16)) is None
    assert kernels.float32_linear(torch.randn(40, 64).bfloat16(), None) is None  # out not a multiple of 16


@storage_only
def test_the_platform_serves_bfloat16_layers_with_the_storage_only_path() -> None:
    cpu, platform = torch.device("cpu"), CpuPlatform()
    assert torch.bfloat16 in platform.supported_dtypes
    assert "bfloat16 storage, float32 arithmetic" in platform.kernel_paths()["bfloat16"]
    gen = torch.Generator().manual_seed(1)
    linear = Linear(64, 48, True, cpu, torch.bfloat16)
    linear.weight.data.copy_(torch.randn(48, 64, generator=gen))
    linear.bias.data.copy_(torch.randn(48, generator=gen))
    x = torch.randn(3, 64, generator=gen).bfloat16()
    kernel = platform.layer_kernel(linear)
    assert kernel is not None
    exact = _exact(x, linear.weight, linear.bias)
    assert ((kernel(x).double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3).all()
    swiglu = SwiGLUProjection(64, 32, False, cpu, torch.bfloat16)
    swiglu.weight.data.copy_(torch.randn(64, 64, generator=gen))
    fused = platform.layer_kernel(swiglu)
    assert fused is not None
    torch.testing.assert_close(fused(x).float(), swiglu.dense_forward(x, swiglu.weight).float(), rtol=0.02,
                               atol=0.02)
    norm = RMSNorm(64, 1e-5, cpu, torch.bfloat16)
    assert platform.layer_kernel(norm) is not None  # the fused residual-add norm, its portable loop here
