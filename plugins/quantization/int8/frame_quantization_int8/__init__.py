"""frame-quantization-int8: linear weights quantized to int8 per output channel at load."""

from frame_quantization_int8.method import ChannelInt8, Int8Method, Int8Options

__all__ = ["ChannelInt8", "Int8Method", "Int8Options"]
