"""Activations by their transformers names, and the gated (GLU) activation for any of them.

:func:`activation` maps a config's ``hidden_act`` / ``hidden_activation`` to a function: SiLU, GELU exact, GELU
with the tanh approximation (``gelu_new``, ``gelu_pytorch_tanh``, ``gelu_fast``: the same curve within float32
rounding), ReLU. Any other name is an :class:`~frame.errors.UnsupportedModelError` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from frame.errors import UnsupportedModelError
from frame.layers.basic import KernelLayer


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (GPT-2's ``gelu_new``, Gemma's ``gelu_pytorch_tanh``)."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_python_tanh": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "relu": F.relu,
}


def activation(name: str, field: str = "hidden_act") -> Callable[[torch.Tensor], torch.Tensor]:
    """The function a config's activation ``name`` means; UnsupportedModelError naming ``field`` otherwise."""
    found = ACTIVATIONS.get(name)
    if found is None:
        raise UnsupportedModelError(
            f"The config's {field} {name!r} is not implemented; frame implements {', '.join(ACTIVATIONS)}.",
            param="model")
    return found


class ActAndMul(KernelLayer):
    """A gated activation: ``act(gate) * up`` for ``x = [gate | up]`` ``[tokens, 2 * intermediate]`` (GeGLU for
    Gemma's GELU). SwiGLU has its own :class:`~frame.layers.basic.SiluAndMul`, which platforms fuse."""

    def __init__(self, name: str, field: str = "hidden_act") -> None:
        super().__init__()
        self.name = name
        self.fn = activation(name, field)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            fused = self.kernel(x)
            if fused is not None:
                return fused
        gate, up = x.chunk(2, dim=-1)
        return self.fn(gate) * up
