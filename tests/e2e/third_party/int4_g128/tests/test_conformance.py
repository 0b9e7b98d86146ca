"""frame's quantization conformance suite, run against this plugin on the suite's dense tiny checkpoint."""

from frame.testing.quantization import QuantizationConformance


class TestInt4Group128(QuantizationConformance):
    plugin_name = "int4_g128"
    # Round to nearest on steps of max|w_group| / 7: half a step at most, and float32's rounding of w / scale.
    rtol = 1 / 14 * (1 + 1e-3)
