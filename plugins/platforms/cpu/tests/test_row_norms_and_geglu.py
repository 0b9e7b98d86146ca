"""The native norms without a residual (Gemma's and OLMo 2's weighted in float32, per-head query and key norms) and
GeGLU's activation: torch's bits or within float32 noise, and the platform attaching them to their layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame.layers import ActAndMul, HeadNorm, UpcastRMSNorm
from frame.parallel import HeadPartition
from frame_platform_cpu import kernels
from frame_platform_cpu.platform import CpuPlatform

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")
DTYPES = [torch.bfloat16, torch.float32]


@pytest.fixture(autouse=True)
def _kernels_loaded() -> None:
    kernels.load()


def upcast_reference(x: torch.Tensor, weight: torch.Tensor, offset: float, eps: float = 1e-6) -> torch.Tensor:
    return (F.rms_norm(x.float(), (x.shape[-1],), eps=eps) * (offset + weight.float())).to(x.dtype)


def assert_norm_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """The float32 sum of squares runs in another order than torch's: a few bfloat16 values may land one step apart
    (at most one in a hundred here), float32 ones within float32 noise."""
    if got.dtype == torch.bfloat16:
        assert (got != want).float().mean() <= 0.01
        torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=8e-3)
    else:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "width"), [(1, 640), (5, 37), (3, 2560)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_the_row_norm_weighted_in_float32_is_the_reference(dtype: torch.dtype, rows: int, width: int,
                                                           offset: float) -> None:
    torch.manual_seed(rows + width)
    x, weight = (torch.randn(rows, width) * 3).to(dtype), (torch.randn(width) * 0.2).to(dtype)
    norm = kernels.fused_rms_norm(weight, 1e-6, offset)
    want = upcast_reference(x, weight, offset)
    assert_norm_close(norm(x), want)
    out = torch.empty_like(x)
    torch.ops.frame_cpu.rms_norm_into(x, (offset + weight.float()).contiguous(), 1e-6, out)
    assert_norm_close(out, want)
    wide = torch.randn(rows, 2 * width).to(dtype)
    assert_norm_close(norm(wide[:, :width]), upcast_reference(wide[:, :width], weight, offset))  # strided rows
    assert norm(x.half()) is None and norm(x.unsqueeze(0)) is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upcast", [True, False])
def test_head_norms_normalise_each_strided_head_in_place_and_nothing_else(dtype: torch.dtype, upcast: bool) -> None:
    torch.manual_seed(3)
    tokens, heads, head_dim = 3, 4, 256
    qkv = torch.randn(tokens, (heads + 2) * head_dim).to(dtype)
    weight = (torch.randn(head_dim) * 0.2).to(dtype)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    if upcast:
        want = upcast_reference(q, weight, 1.0)
    else:  # Qwen 3's: the normalised value rounds before the weight multiplies, as Llama's norm
        want = weight * F.rms_norm(q.float(), (head_dim,), eps=1e-6).to(dtype)
    rest = qkv[:, heads * head_dim :].clone()
    assert kernels.fused_head_rms_norm(weight, 1e-6, 1.0 if upcast else 0.0, upcast)(q)
    assert_norm_close(q, want)
    assert torch.equal(qkv[:, heads * head_dim :], rest)


def test_a_head_norm_declines_a_weight_of_another_dtype() -> None:
    norm = kernels.fused_head_rms_norm(torch.ones(8, dtype=torch.float32), 1e-6, upcast=False)
    assert norm(torch.ones(2, 1, 8, dtype=torch.bfloat16)) is None


@pytest.mark.parametrize(("rows", "width"), [(1, 2048), (1, 300), (7, 5), (16, 4096)])
def test_geglu_is_torchs_within_float32_noise(rows: int, width: int) -> None:
    torch.manual_seed(width)
    x = torch.randn(rows, 2 * width) * 3
    gate, up = x.chunk(2, dim=-1)
    want = F.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(kernels.fused_gelu_tanh_and_mul()(x), want, rtol=1e-5, atol=1e-5)
    out = torch.empty(rows, width)
    torch.ops.frame_cpu.gelu_tanh_and_mul_into(x, out)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_bfloat16_geglu_is_torchs_but_in_the_far_negative_tail() -> None:
    """gelu_tanh is computed as x sigmoid(2y); torch's 0.5 x (1 + tanh(y)) loses the tail's few significant bits to
    cancellation (gate below about -3, where the value is under 1e-2 of the gate). Elsewhere the bits are torch's
    but where the polynomial exp moves a rounding by one step."""
    torch.manual_seed(0)
    x = (torch.randn(16, 2 * 4096) * 3).bfloat16()
    gate, up = x.chunk(2, dim=-1)
    want = F.gelu(gate, approximate="tanh") * up
    got = kernels.fused_gelu_tanh_and_mul()(x)
    differ = got != want
    assert (differ & (gate > -2.5)).float().mean() < 1e-3
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-3)


def test_the_platform_attaches_the_float32_computing_kernels_to_their_layers() -> None:
    platform = CpuPlatform()
    norm = UpcastRMSNorm(64, 1e-6, torch.device("cpu"), torch.bfloat16, offset=1.0)
    norm.weight.data.normal_(0, 0.2)
    x = torch.randn(3, 64).bfloat16()
    kernel = platform.layer_kernel(norm)
    assert kernel is not None and torch.equal(kernel(x), norm.reference(x))
    heads = HeadPartition(q_start=0, q_count=2, kv_start=0, kv_count=1)
    q_norm, _ = HeadNorm.for_queries_and_keys(16, 2, 1, heads, 1e-6, per_head=True, device=torch.device("cpu"),
                                              dtype=torch.bfloat16, upcast=True, offset=1.0)
    assert platform.layer_kernel(q_norm) is not None
    across, _ = HeadNorm.for_queries_and_keys(16, 2, 1, heads, 1e-6, per_head=False, device=torch.device("cpu"),
                                              dtype=torch.bfloat16, upcast=True)
    assert platform.layer_kernel(across) is None  # OLMo 2's norm across heads sums over ranks: torch's path
    assert platform.layer_kernel(ActAndMul("gelu_pytorch_tanh", "hidden_activation")) is not None
    assert platform.layer_kernel(ActAndMul("gelu")) is None  # the exact GELU keeps torch's erf
