"""frame-quantization-gguf: a GGUF file's quantized blocks kept packed for the platform's kernels."""

from frame_quantization_gguf.method import GGUFMethod, GGUFOptions
from frame_quantization_gguf.weights import PackedGGUFWeights

__all__ = ["GGUFMethod", "GGUFOptions", "PackedGGUFWeights"]
