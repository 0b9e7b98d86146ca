"""GGUFMethod: serve a GGUF file with its linear weights in the blocks the file stores them in."""

from __future__ import annotations

from pathlib import Path

import torch
from frame.interfaces.model import WeightSource
from frame.interfaces.quantization import PackedWeight, QuantizationMethod
from pydantic import BaseModel, ConfigDict, Field, field_validator

from frame_quantization_gguf.weights import KEPT_FORMATS, PackedGGUFWeights


class GGUFOptions(BaseModel):
    """Options of the ``gguf`` quantization plugin (``--quantization-opt keep=[q4_1,q8_0]``)."""

    model_config = ConfigDict(extra="forbid")

    keep: list[str] = Field(default_factory=lambda: list(KEPT_FORMATS),
                            description="block formats kept packed; tensors in other formats are dequantised at load")

    @field_validator("keep")
    @classmethod
    def _known(cls, keep: list[str]) -> list[str]:
        unknown = sorted(set(keep) - set(KEPT_FORMATS))
        if unknown:
            raise ValueError(f"cannot keep {', '.join(unknown)} packed; formats: {', '.join(KEPT_FORMATS)}")
        return keep


class GGUFMethod(QuantizationMethod):
    """Reads a ``.gguf`` file's matrices of ggml's block types (``frame.weights.ggml.GGML_TYPES``: q4_0 ... iq4_xs)
    as :class:`frame.weights.GGMLWeight` (the file's bytes, unchanged); everything else arrives dense, as the core's
    reader gives it (a quantized tensor with one warning line per type).
    A dense checkpoint has no blocks to keep, so it is refused rather than quantized."""

    formats = KEPT_FORMATS

    def __init__(self, options: GGUFOptions | None = None) -> None:
        self.options = options or GGUFOptions()

    def check(self, model_path: Path, hf_config: object) -> str | None:
        if model_path.is_file() and model_path.suffix == ".gguf":
            return None
        return "it reads the blocks of a .gguf file, and this checkpoint is a folder of dense weights (use " \
               "--quantization int8 to quantize one)"

    def open_weights(self, model_path: Path) -> WeightSource | None:
        return PackedGGUFWeights(model_path, frozenset(self.options.keep))

    def quantize(self, name: str, weight: torch.Tensor) -> PackedWeight | None:
        """Nothing: a GGUF's quantized tensors arrive packed; its dense ones (norms, f32 matrices) stay dense."""
        return None
