"""frame's quantization conformance suite, run on the int8 plugin with the suite's dense tiny checkpoint."""

from __future__ import annotations

from frame.testing.quantization import QuantizationConformance


class TestInt8Conformance(QuantizationConformance):
    plugin_name = "int8"
    # Round to nearest on steps of max|w_row| / 127: half a step at most, and float32's rounding of w / scale.
    rtol = 1 / 254 * (1 + 1e-3)
