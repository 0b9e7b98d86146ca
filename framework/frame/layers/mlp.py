"""The feed-forward blocks of decoder layers, tensor-parallel: gated (SwiGLU, GeGLU) and plain (GPT-2's).

Both split their intermediate features over the ranks and sum the down projection's partial products, so a family
that builds its MLP from here runs under ``--tensor-parallel-size N`` unchanged. Module names are what checkpoint
name maps target: ``gate_up`` (parts ``gate`` and ``up``) and ``down_proj`` for :class:`GatedMLP`, ``up`` and
``down_proj`` for :class:`MLP`.
"""

from __future__ import annotations

import torch
from torch import nn

from frame.layers.activation import ActAndMul, activation
from frame.layers.parallel import ColumnParallelLinear, OutputPart, RowParallelLinear, SwiGLUProjection
from frame.parallel import parallel_context


class GatedProjection(ColumnParallelLinear):
    """``act(gate) * up`` for ``[gate | up] = x W^T + b`` with any activation of :mod:`frame.layers.activation`
    (SiLU takes :class:`~frame.layers.parallel.SwiGLUProjection`, whose epilogue platforms fuse). Parts ``gate`` and
    ``up``; the output, ``intermediate`` features split over the ranks, is at :attr:`output_range`."""

    def __init__(self, n_in: int, intermediate: int, act: str, bias: bool, device: torch.device,
                 dtype: torch.dtype, field: str = "hidden_act") -> None:
        start, size = parallel_context().split(intermediate)
        self.output_range = (start, size)
        super().__init__(n_in, [OutputPart("gate", intermediate, start, size), OutputPart("up", intermediate, start,
                                                                                          size)], bias, device, dtype)
        self.act = ActAndMul(act, field)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(super().forward(x))


def gated_projection(hidden: int, intermediate: int, act: str, bias: bool, device: torch.device, dtype: torch.dtype,
                     field: str = "hidden_act") -> SwiGLUProjection | GatedProjection:
    """The gate-up side of a gated MLP: :class:`SwiGLUProjection` for SiLU (its epilogue platforms fuse), else
    :class:`GatedProjection` with ``act``."""
    if act in ("silu", "swish"):
        return SwiGLUProjection(hidden, intermediate, bias, device, dtype)
    return GatedProjection(hidden, intermediate, act, bias, device, dtype, field)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: Llama's SwiGLU, Gemma's GeGLU; gate and up in one matmul."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool, device: torch.device,
                 dtype: torch.dtype, field: str = "hidden_act") -> None:
        super().__init__()
        self.gate_up = gated_projection(hidden, intermediate, act, bias, device, dtype, field)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias, device, dtype,
                                           input_range=self.gate_up.output_range)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up(x))


class MLP(nn.Module):
    """``down(act(up(x)))`` with biases (GPT-2's ``c_fc``, activation, ``c_proj``)."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool, device: torch.device,
                 dtype: torch.dtype, field: str = "activation_function") -> None:
        super().__init__()
        self.up = ColumnParallelLinear.split_evenly(hidden, intermediate, bias, device, dtype)
        self.act = activation(act, field)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias, device, dtype,
                                           input_range=parallel_context().split(intermediate))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up(x)))
