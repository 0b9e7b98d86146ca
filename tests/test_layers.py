"""frame.layers: the torch reference paths, and how a platform's kernels attach to a loaded model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from frame.interfaces.platform import Platform
from frame.layers import (
    Embedding,
    Linear,
    RMSNorm,
    SiluAndMul,
    SwiGLUProjection,
    attach_platform_kernels,
    finish_loading,
)
from frame.weights import GGMLWeight
from torch import nn


class RecordingPlatform(Platform):
    """A test double: its "kernels" return constants, so a test can see which path ran."""

    name = "recording"

    def __init__(self, offer: bool = True) -> None:
        self.offer = offer
        self.norm_declines = False
        self.table_declines = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def supported_dtypes(self):
        return (torch.float32,)

    def describe(self) -> str:
        return "recording double"

    def kv_cache_budget_bytes(self, memory_fraction: float, model_bytes: int) -> int:
        return 0

    def preferred_attention(self, installed):
        return installed[0]

    def layer_kernel(self, layer):
        if not self.offer:
            return None
        if isinstance(layer, Linear):
            return lambda x: torch.full((*x.shape[:-1], layer.weight.shape[0]), 7.0)
        if isinstance(layer, RMSNorm):
            return lambda x, residual: None if self.norm_declines else (torch.full_like(x, 9.0), x)
        if getattr(layer, "reads_packed_rows", False):
            return lambda ids: None if self.table_declines else torch.full((*ids.shape, layer.weight.shape[1]), 5.0)
        return lambda x: torch.zeros(x.shape[0], x.shape[1] // 2)


def _model() -> nn.Module:
    model = nn.Module()
    model.proj = Linear(4, 3, True, torch.device("cpu"), torch.float32)
    model.norm = RMSNorm(4, 1e-6, torch.device("cpu"), torch.float32)
    model.tied = Linear(3, 4, False, torch.device("cpu"), torch.float32, weight=model.proj.weight)
    model.act = SiluAndMul()
    for p in model.parameters():
        p.data.normal_()
    return model


def test_linear_without_a_kernel_is_f_linear() -> None:
    model = _model()
    x = torch.randn(2, 4)
    assert torch.equal(model.proj(x), F.linear(x, model.proj.weight, model.proj.bias))
    assert model.tied.weight is model.proj.weight


def test_norm_reference_adds_the_residual_then_normalises_in_float32() -> None:
    norm = _model().norm
    x, residual = torch.randn(3, 4), torch.randn(3, 4)
    out, summed = norm(x, residual)
    assert torch.equal(summed, x + residual)
    expected = norm.weight * F.rms_norm(summed, (4,), eps=1e-6)
    torch.testing.assert_close(out, expected)


def test_platform_kernels_attach_and_serve() -> None:
    model = _model()
    platform = RecordingPlatform()
    assert attach_platform_kernels(model, platform) == 4
    assert torch.equal(model.act(torch.ones(2, 6)), torch.zeros(2, 3))
    x = torch.randn(2, 4)
    assert torch.equal(model.proj(x), torch.full((2, 3), 7.0))
    out, summed = model.norm(x, x)
    assert torch.equal(out, torch.full((2, 4), 9.0)) and torch.equal(summed, x)
    # Without a residual the kernel is asked too (residual None); when it declines, the reference runs.
    out, summed = model.norm(x)
    assert torch.equal(out, torch.full((2, 4), 9.0)) and summed is x
    platform.norm_declines = True
    assert torch.equal(model.norm(x, x)[1], x + x)
    assert not torch.equal(model.norm(x)[0], torch.full((2, 4), 9.0))


def test_a_platform_without_kernels_leaves_torch_in_place() -> None:
    model = _model()
    assert attach_platform_kernels(model, RecordingPlatform(offer=False)) == 0
    assert model.proj.kernel is None and model.norm.kernel is None
    x = torch.randn(2, 6)
    assert torch.equal(model.act(x), F.silu(x[:, :3]) * x[:, 3:])


def test_only_a_table_kept_packed_is_offered_to_the_platform() -> None:
    # A dense table keeps F.embedding; a packed one takes the platform's lookup, and where that declines it
    # dequantizes the rows it reads (never the whole table, as a packed linear's fallback would).
    cpu = torch.device("cpu")
    dense, packed = Embedding(96, 64, cpu, torch.float32), Embedding(96, 64, cpu, torch.float32)
    dense.weight.data.normal_()
    table = GGMLWeight.quantized("q8_0", torch.randn(96, 64, generator=torch.Generator().manual_seed(3)))
    packed.load("weight", table)
    model = nn.ModuleDict({"dense": dense, "packed": packed})
    assert finish_loading(model, None) == 1
    platform = RecordingPlatform()
    assert attach_platform_kernels(model, platform) == 1 and dense.kernel is None
    ids = torch.tensor([[3, 95], [3, 0]])
    assert torch.equal(dense(ids), F.embedding(ids, dense.weight))
    assert torch.equal(packed(ids), torch.full((2, 2, 64), 5.0))
    platform.table_declines = True
    assert torch.equal(packed(ids), table.dequantize()[ids])


def test_swiglu_projection_reference_is_the_linear_then_the_activation() -> None:
    layer = SwiGLUProjection(4, 3, True, torch.device("cpu"), torch.float32)
    for p in layer.parameters():
        p.data.normal_()
    x = torch.randn(5, 4)
    gate_up = F.linear(x, layer.weight, layer.bias)
    assert layer.weight.shape == (6, 4)
    assert torch.equal(layer(x), F.silu(gate_up[:, :3]) * gate_up[:, 3:])
