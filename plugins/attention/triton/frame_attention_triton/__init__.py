"""frame-attention-triton: paged attention and KV writes as Triton kernels (CUDA and ROCm)."""
