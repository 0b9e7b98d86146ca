"""Layers model families build from, whose kernels a platform may take over once the weights are loaded.

Model families use :class:`Linear` for every weight matmul (QKV, output, MLP, logits) and :class:`RMSNorm` for
their norms. After loading, :func:`attach_platform_kernels` asks the platform for a faster kernel per layer
(:meth:`Platform.linear_kernel`, :meth:`Platform.rms_norm_kernel`): a CPU's small-batch bfloat16 matmul, a
fused residual-add norm. Without one, the plain torch code below runs; it is also the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from frame.interfaces.platform import Platform

#: ``kernel(x) == F.linear(x, weight, bias)`` up to rounding, for ``x`` ``[..., in_features]``.
LinearKernel = Callable[[torch.Tensor], torch.Tensor]
#: ``kernel(x, residual) == RMSNorm.reference(x, residual)``; may return None to decline (then torch runs).
NormKernel = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]


def empty_parameter(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised, frozen parameter: loading overwrites it."""
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


class Linear(nn.Module):
    """``y = x W^T + b``; ``weight`` is ``[out, in]``; parameters start uninitialised, loading fills them."""

    def __init__(self, n_in: int, n_out: int, bias: bool, device: torch.device, dtype: torch.dtype,
                 weight: nn.Parameter | None = None) -> None:
        """``weight`` shares an existing parameter (tied embeddings) instead of creating one."""
        super().__init__()
        self.weight = weight if weight is not None else empty_parameter(n_out, n_in, device=device, dtype=dtype)
        self.bias = empty_parameter(n_out, device=device, dtype=dtype) if bias else None
        self.kernel: LinearKernel | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x)
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """RMS normalisation in float32, optionally adding the residual stream first (as Llama-style blocks do)."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = empty_parameter(size, device=device, dtype=dtype)
        self.eps = eps
        self.kernel: NormKernel | None = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``; without ``residual``, ``(norm(x), x)``."""
        if residual is not None and self.kernel is not None:
            fused = self.kernel(x, residual)
            if fused is not None:
                return fused
        return self.reference(x, residual)

    def reference(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch computation: the sum in the model's dtype, the norm in float32 as transformers computes it,
        rounded back before the weight multiplies it."""
        if residual is not None:
            x = x + residual
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * h.to(x.dtype), x


def attach_platform_kernels(model: nn.Module, platform: Platform) -> int:
    """Give every :class:`Linear` and :class:`RMSNorm` of ``model`` the platform's kernel; returns how many took one."""
    attached = 0
    for module in model.modules():
        if isinstance(module, Linear):
            module.kernel = platform.linear_kernel(module.weight, module.bias)
        elif isinstance(module, RMSNorm):
            module.kernel = platform.rms_norm_kernel(module.weight, module.eps)
        else:
            continue
        attached += module.kernel is not None
    return attached
