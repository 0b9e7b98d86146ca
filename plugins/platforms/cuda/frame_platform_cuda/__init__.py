"""frame-platform-cuda: run frame on an NVIDIA GPU."""
