"""frame-attention-rocm-aiter: frame's attention contract on AMD's AITER kernels."""
