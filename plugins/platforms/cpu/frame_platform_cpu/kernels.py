"""The platform's C++ kernels (``csrc/*.cpp``: small-batch bfloat16 linear, fused residual-add RMSNorm).

Built for this CPU on first use (:mod:`frame.native`).

``python -m frame_platform_cpu.build`` builds them ahead of time (``make setup`` does).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from frame import native

NAME = "frame_cpu"
SOURCES = tuple(sorted((Path(__file__).parent / "csrc").glob("*.cpp")))
CFLAGS = ("-O3", "-march=native")
#: Up to this many rows the bfloat16 kernel beats torch's (it reads the weight at memory speed; measured 2.8x at
#: 1 row, 1.5x at 4, 1.2x at 16 and 0.96x at 32 on SmolLM2-135M's shapes); more rows go to torch's GEMM.
SMALL_BATCH_ROWS = 16


def unavailable_reason() -> str | None:
    """None when the kernels are built or can be built here; otherwise why not."""
    return native.unavailable_reason(NAME, SOURCES, CFLAGS)


def load() -> None:
    """Make ``torch.ops.frame_cpu.*`` available, building the library if needed."""
    native.load_library(NAME, SOURCES, CFLAGS)


def small_batch_linear(weight: torch.Tensor, bias: torch.Tensor | None):
    """``F.linear`` over ``weight`` that takes the native kernel for bfloat16 batches of few rows."""
    load()
    op = torch.ops.frame_cpu.small_linear

    def linear(x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= SMALL_BATCH_ROWS and x.dtype == torch.bfloat16:
            return op(x, weight, bias)
        return F.linear(x, weight, bias)

    return linear



def fused_add_rms_norm(weight: torch.Tensor, eps: float):
    """Residual add plus RMSNorm in one native pass for bfloat16 rows; None (torch's path) for other dtypes."""
    load()
    op = torch.ops.frame_cpu.add_rms_norm

    def norm(x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        if x.dtype != torch.bfloat16 or residual.dtype != torch.bfloat16 or x.dim() != 2:
            return None
        return op(x, residual, weight, eps)

    return norm
