"""``python -m frame_platform_cpu.build``: build the platform's C++ kernels ahead of first use."""

from __future__ import annotations

import sys

from frame import native

from frame_platform_cpu import kernels

if __name__ == "__main__":
    if reason := kernels.unavailable_reason():
        sys.exit(f"frame_platform_cpu: kernels not built: the platform {reason}")
    kernels.load()
    print(f"cpu platform kernels ready in {native.build_directory(kernels.NAME, kernels.SOURCES, kernels.CFLAGS)}")
