"""frame-quantization-int4-g128: int4 weights in groups of 128 inputs, a packed format of its own."""
