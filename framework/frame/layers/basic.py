"""The single-rank layers, whose kernels a platform may take over once the weights are loaded.

:class:`Linear` is a replicated matmul (the same weight on every tensor-parallel rank), :class:`SiluAndMul` SwiGLU's
activation, :class:`RMSNorm` a norm and :class:`RotateHalves` rotary embedding. After loading,
:func:`attach_platform_kernels` asks the platform for a faster kernel per :class:`KernelLayer`
(:meth:`Platform.layer_kernel`): a CPU's packed bfloat16 matmul, a fused residual-add norm, rotary. Without one,
the plain torch code below runs; it is also the reference. Every layer with weights loads a checkpoint tensor
through ``load(kind, tensor, part)``, so that the sharded layers of :mod:`frame.layers.parallel` can keep only
their rank's slice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from frame.interfaces.platform import Platform
from frame.interfaces.quantization import PackedWeight
from frame.layers.quantized import packed_weight, store_rows, table_rows, with_reference

#: A platform's replacement for a layer's computation: same arguments as the layer's ``forward``, same result up
#: to rounding, or None to decline this call (then the layer's torch reference runs).
LayerKernel = Callable[..., Any]


def empty_parameter(*shape: int, device: torch.device, dtype: torch.dtype) -> nn.Parameter:
    """An uninitialised, frozen parameter: loading overwrites it."""
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


def copy_checked(param: torch.Tensor | None, tensor: torch.Tensor, what: str) -> None:
    """``param.copy_(tensor)`` after checking the shapes agree (ValueError naming both otherwise); a packed
    ``tensor`` is kept packed for :func:`~frame.layers.loading.finish_loading`."""
    if param is None:
        raise ValueError(f"the checkpoint has a {what} that this layer does not have")
    if isinstance(tensor, PackedWeight):
        store_rows(param, 0, tensor, what)
        return
    if tuple(param.shape) != tuple(tensor.shape):
        raise ValueError(f"a checkpoint {what} of shape {tuple(tensor.shape)} does not fit {tuple(param.shape)}")
    param.data.copy_(tensor)


class KernelLayer(nn.Module):
    """A layer whose computation a platform may replace after loading (:attr:`kernel`, None: torch's)."""

    kernel: LayerKernel | None = None


class Linear(KernelLayer):
    """``y = x W^T + b``; ``weight`` is ``[out, in]``; parameters start uninitialised, loading fills them."""

    def __init__(self, n_in: int, n_out: int, bias: bool, device: torch.device, dtype: torch.dtype,
                 weight: nn.Parameter | None = None) -> None:
        """``weight`` shares an existing parameter (tied embeddings) instead of creating one."""
        super().__init__()
        self.weight = weight if weight is not None else empty_parameter(n_out, n_in, device=device, dtype=dtype)
        self.bias = empty_parameter(n_out, device=device, dtype=dtype) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            out = self.kernel(x)
            if out is not None:
                return out
        return self.dense_forward(x, self.weight)

    def dense_forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The layer's torch computation over ``weight`` (its own, or a packed one dequantised)."""
        return F.linear(x, weight, self.bias)

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        """Copy a checkpoint tensor into ``weight`` or ``bias`` (``kind``); ValueError for a wrong shape."""
        copy_checked(getattr(self, kind), tensor, f"{kind}")

    def load_parts(self) -> list[str | None]:
        """The ``part`` names a checkpoint fills (None: the whole parameter in one tensor)."""
        return [None]


class Embedding(KernelLayer):
    """A lookup table every rank holds whole (GPT-2's learned positions); the vocabulary's is
    :class:`~frame.layers.parallel.VocabParallelEmbedding`. Where a quantization plugin keeps it packed, a platform's
    kernel for it takes the ids and returns their rows."""

    def __init__(self, num: int, dim: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = empty_parameter(num, dim, device=device, dtype=dtype)

    #: Looks rows up from a packed table (:func:`~frame.layers.quantized.table_rows`): loading may keep it packed.
    reads_packed_rows = True

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return table_rows(self, ids)

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        copy_checked(self.weight if kind == "weight" else None, tensor, kind)

    def load_parts(self) -> list[str | None]:
        return [None]


class SiluAndMul(KernelLayer):
    """SwiGLU's activation: ``silu(gate) * up`` for ``x = [gate | up]`` ``[tokens, 2 * intermediate]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            fused = self.kernel(x)
            if fused is not None:
                return fused
        return self.reference(x)

    @staticmethod
    def reference(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class RotateHalves(KernelLayer):
    """Rotary embedding applied in place, the first half of each head paired with the second (GPT-NeoX style)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate ``x`` ``[tokens, heads, head_dim]`` (rows may be strided) by ``cos``/``sin`` ``[tokens, 1, head_dim
        // 2]``, in place."""
        if self.kernel is not None and self.kernel(x, cos, sin) is not None:
            return
        self.reference(x, cos, sin)

    @staticmethod
    def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        first, second = x.chunk(2, dim=-1)
        rotated_first = first * cos - second * sin
        second.mul_(cos).addcmul_(first, sin)
        first.copy_(rotated_first)


class RMSNorm(KernelLayer):
    """RMS normalisation in float32, optionally adding the residual stream first (as Llama-style blocks do)."""

    def __init__(self, size: int, eps: float, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = empty_parameter(size, device=device, dtype=dtype)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``; without ``residual``, ``(norm(x), x)``. A platform's kernel is
        called as ``kernel(x, residual)``, ``residual`` None for a norm without one, and returns None to decline."""
        if self.kernel is not None:
            fused = self.kernel(x, residual)
            if fused is not None:
                return fused
        return self.reference(x, residual)

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        copy_checked(self.weight, tensor, "weight")

    def load_parts(self) -> list[str | None]:
        return [None]

    def reference(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch computation: the sum in the model's dtype, the norm in float32 as transformers computes it,
        rounded back before the weight multiplies it."""
        if residual is not None:
            x = x + residual
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * h.to(x.dtype), x


def attach_platform_kernels(model: nn.Module, platform: Platform) -> int:
    """Give every :class:`KernelLayer` of ``model`` the platform's kernel for it; returns how many took one."""
    attached = 0
    for module in model.modules():
        if isinstance(module, KernelLayer):
            table, packed = getattr(module, "reads_packed_rows", False), packed_weight(module) is not None
            if table and not packed:
                continue  # a dense table keeps F.embedding: platforms are asked only about packed ones
            module.kernel = platform.layer_kernel(module)
            attached += module.kernel is not None
            if packed and not table:
                module.kernel = with_reference(module, module.kernel)  # a table falls back to its own rows
    return attached
