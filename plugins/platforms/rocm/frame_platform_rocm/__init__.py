"""frame-platform-rocm: run frame on an AMD GPU."""
