"""The platform's C++ kernels (``csrc/*.cpp``: small-batch bfloat16 linear, fused residual-add RMSNorm,
fused SwiGLU activation, in-place rotary).

Built for this CPU on first use (:mod:`frame.native`).

``python -m frame_platform_cpu.build`` builds them ahead of time (``make setup`` does).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from frame import native

NAME = "frame_cpu"
SOURCES = tuple(sorted((Path(__file__).parent / "csrc").glob("*.cpp")))
CFLAGS = ("-O3", "-march=native")
#: Up to this many rows the native kernel beats oneDNN (it reads the weights at memory speed: SmolLM2-135M's 30
#: layers at 2 threads took 7.2 ms at 1-2 rows vs 11.3 ms prepacked); from 4 rows oneDNN's blocked GEMM wins.
SMALL_BATCH_ROWS = 2

@functools.cache  # hashes the sources and reads /proc/cpuinfo: asked once per layer at load
def unavailable_reason() -> str | None:
    """None when the kernels are built or can be built here; otherwise why not."""
    return native.unavailable_reason(NAME, SOURCES, CFLAGS)


def load() -> None:
    """Make ``torch.ops.frame_cpu.*`` available, building the library if needed."""
    native.load_library(NAME, SOURCES, CFLAGS)


def bfloat16_linear(weight: torch.Tensor, bias: torch.Tensor | None):
    """``F.linear`` over a bfloat16 ``weight``: the native kernel for one or two rows, else oneDNN on a weight
    prepacked once into its blocked layout (bitwise equal to ``F.linear``, which repacks on every call: 1.2-1.5x
    slower from 4 to 128 rows here)."""
    load()
    small = torch.ops.frame_cpu.small_linear.default
    pointwise = torch.ops.mkldnn._linear_pointwise.default
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def linear(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            return F.linear(x, weight, bias)
        if x.shape[0] <= SMALL_BATCH_ROWS:
            return small(x, weight, bias)
        return pointwise(x, packed, bias, "none", [], "")

    return linear


def fused_add_rms_norm(weight: torch.Tensor, eps: float):
    """Residual add plus RMSNorm in one native pass for bfloat16 rows; None (torch's path) for other dtypes."""
    load()
    op = torch.ops.frame_cpu.add_rms_norm.default

    def norm(x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        if x.dtype != torch.bfloat16 or residual.dtype != torch.bfloat16 or x.dim() != 2:
            return None
        return op(x, residual, weight, eps)

    return norm


def fused_silu_and_mul():
    """SwiGLU's ``silu(gate) * up`` in one native pass for bfloat16 rows; None (torch's path) otherwise."""
    load()
    op = torch.ops.frame_cpu.silu_and_mul.default

    def act(x: torch.Tensor) -> torch.Tensor | None:
        if x.dtype != torch.bfloat16 or x.dim() != 2:
            return None
        return op(x)

    return act


def fused_rotate_halves():
    """Rotary embedding in place in one native pass for bfloat16 (bitwise torch's result); None otherwise."""
    load()
    op = torch.ops.frame_cpu.rotate_halves_.default

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool | None:
        if x.dtype != torch.bfloat16 or cos.dtype != torch.bfloat16 or x.dim() != 3 or x.stride(2) != 1:
            return None
        op(x, cos, sin)
        return True

    return rotate
