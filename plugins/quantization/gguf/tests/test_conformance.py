"""frame's quantization conformance suite, run on the gguf plugin with the bundled Q4_1 GGUF."""

from __future__ import annotations

from frame.testing.quantization import QuantizationConformance


class TestGGUFConformance(QuantizationConformance):
    plugin_name = "gguf"
