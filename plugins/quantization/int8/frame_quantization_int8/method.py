"""Int8Method: quantize every linear weight of a dense checkpoint to int8, one scale per output feature, with
SmoothQuant's smoothing for W8A8."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from frame.interfaces.quantization import PackedWeight, QuantizationMethod
from pydantic import BaseModel, ConfigDict, Field


class ChannelInt8(PackedWeight):
    """The ``int8`` format: ``q`` int8 ``[out, in]`` and ``scale`` float32 ``[out, 1]``, w = scale * q.

    ``activations`` tells the platform what the method asks of the product: ``dynamic`` lets it quantize each
    row of x to int8 with its own scale (W8A8) where it has fast int8 dot products; ``none`` keeps x as it is
    (weight-only).

    ``input_scale`` (float32 ``[in]``, or None) is a smoothed weight's per-input factor: the int8 values hold
    ``w / input_scale``, so ``w = scale * q * input_scale`` and the product takes ``x * input_scale``."""

    def __init__(self, tensors: dict[str, torch.Tensor], in_features: int, activations: str = "dynamic",
                 input_scale: torch.Tensor | None = None) -> None:
        super().__init__("int8", tensors, in_features)
        self.activations = activations
        self.input_scale = input_scale

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = self.tensors["q"].float() * self.tensors["scale"]
        return (w if self.input_scale is None else w * self.input_scale).to(dtype)

    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
        return ChannelInt8(tensors, in_features, self.activations, self.input_scale)

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        """Any inputs: the scales are per output feature (and the smoothing factors per input, sliced alike)."""
        q = self.tensors["q"][:, start : start + length].contiguous()
        smooth = None if self.input_scale is None else self.input_scale[start : start + length].contiguous()
        return ChannelInt8({"q": q, "scale": self.tensors["scale"]}, length, self.activations, smooth)


class Int8Options(BaseModel):
    """Options of the ``int8`` quantization plugin (``--quantization-opt activations=none``)."""

    model_config = ConfigDict(extra="forbid")

    activations: Literal["dynamic", "none"] = Field(
        "dynamic", description="dynamic: W8A8, each token's activations quantized to int8 with its own scale where "
        "the platform has fast int8 dot products (VNNI); none: weight-only")
    skip: list[str] = Field(default_factory=lambda: ["lm_head"],
                            description="module paths (or their last part) whose weights stay dense")
    smoothing: float = Field(
        0.7, ge=0.0, le=1.0, description="W8A8 only: SmoothQuant's migration strength alpha (per input feature, "
        "s = max|x|^alpha / max|w|^(1 - alpha) over a calibration text run at load; x / s is quantized per token "
        "and w * s per output channel); 0 turns smoothing and the calibration pass off")


class Int8Method(QuantizationMethod):
    """Symmetric per-output-channel int8 of every linear weight but those in ``skip`` (by default the output
    projection, whose logits decide the tokens): ``scale = max|w_row| / 127``, ``q = round(w / scale)``.

    For W8A8 (``activations='dynamic'``) it first smooths each weight as SmoothQuant does (Xiao et al., 2023):
    a few input features of the activations are far larger than the rest, so one int8 scale per token leaves the
    others a handful of steps (SmolLM2-135M: perplexity +6.2% unsmoothed). Dividing feature ``j`` of x by ``s_j``
    and multiplying column ``j`` of the weight by it leaves the product unchanged and evens both out; the factors
    come from the largest ``|x|`` per feature that the engine records over ``calibration.txt`` (a short mix of
    chat, code, prose and numbers, shipped with the plugin) before quantizing."""

    formats = ("int8",)

    def __init__(self, options: Int8Options | None = None) -> None:
        self.options = options or Int8Options()

    def calibration_text(self) -> str | None:
        """The shipped calibration text, for W8A8 with smoothing; None otherwise."""
        if self.options.activations != "dynamic" or self.options.smoothing == 0:
            return None
        return CALIBRATION.read_text()

    def quantize(self, name: str, weight: torch.Tensor,
                 input_absmax: torch.Tensor | None = None) -> PackedWeight | None:
        if name in self.options.skip or name.rsplit(".", 1)[-1] in self.options.skip:
            return None
        w = weight.float()
        input_scale = None
        if input_absmax is not None and self.options.activations == "dynamic" and self.options.smoothing > 0:
            factors = smoothing_factors(input_absmax, w, self.options.smoothing)
            w = w * factors
            input_scale = (1.0 / factors).contiguous()
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
        return ChannelInt8({"q": q, "scale": scale}, weight.shape[1], self.options.activations, input_scale)


#: Text the engine runs the dense model over before W8A8 smoothing (not the perplexity benchmark's text).
CALIBRATION = Path(__file__).with_name("calibration.txt")


def smoothing_factors(input_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's ``s_j = max|x_j|^alpha / max|w_j|^(1 - alpha)`` per input feature ``j`` (float32 ``[in]``);
    features the text never lit (or weights of zero) keep 1."""
    x = input_absmax.float().to(weight.device)
    w = weight.abs().amax(dim=0)
    factors = x.pow(alpha) / w.pow(1 - alpha)
    usable = (x > 0) & (w > 0) & torch.isfinite(factors)
    return torch.where(usable, factors, torch.ones_like(factors)).clamp(1e-4, 1e4)
