"""Int8Method: quantize every linear weight of a dense checkpoint to int8, one scale per output feature."""

from __future__ import annotations

from typing import Literal

import torch
from frame.interfaces.quantization import PackedWeight, QuantizationMethod
from pydantic import BaseModel, ConfigDict, Field


class ChannelInt8(PackedWeight):
    """The ``int8`` format: ``q`` int8 ``[out, in]`` and ``scale`` float32 ``[out, 1]``, w = scale * q.

    ``activations`` tells the platform what the method asks of the product: ``dynamic`` lets it quantize each
    row of x to int8 with its own scale (W8A8) where it has fast int8 dot products; ``none`` keeps x as it is
    (weight-only)."""

    def __init__(self, tensors: dict[str, torch.Tensor], in_features: int, activations: str = "dynamic") -> None:
        super().__init__("int8", tensors, in_features)
        self.activations = activations

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.tensors["q"].float() * self.tensors["scale"]).to(dtype)

    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
        return ChannelInt8(tensors, in_features, self.activations)

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        """Any inputs: the scales are per output feature."""
        q = self.tensors["q"][:, start : start + length].contiguous()
        return ChannelInt8({"q": q, "scale": self.tensors["scale"]}, length, self.activations)


class Int8Options(BaseModel):
    """Options of the ``int8`` quantization plugin (``--quantization-opt activations=none``)."""

    model_config = ConfigDict(extra="forbid")

    activations: Literal["dynamic", "none"] = Field(
        "dynamic", description="dynamic: W8A8, each token's activations quantized to int8 with its own scale where "
        "the platform has fast int8 dot products (VNNI); none: weight-only")
    skip: list[str] = Field(default_factory=lambda: ["logits"],
                            description="module paths (or their last part) whose weights stay dense")


class Int8Method(QuantizationMethod):
    """Symmetric per-output-channel int8 of every linear weight but those in ``skip`` (by default the output
    projection, whose logits decide the tokens): ``scale = max|w_row| / 127``, ``q = round(w / scale)``."""

    formats = ("int8",)

    def __init__(self, options: Int8Options | None = None) -> None:
        self.options = options or Int8Options()

    def quantize(self, name: str, weight: torch.Tensor) -> PackedWeight | None:
        if name in self.options.skip or name.rsplit(".", 1)[-1] in self.options.skip:
            return None
        w = weight.float()
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
        return ChannelInt8({"q": q, "scale": scale}, weight.shape[1], self.options.activations)
