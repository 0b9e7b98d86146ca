"""The C++ kernel in ``csrc/paged_attention.cpp``, built for this CPU on first use (see :mod:`frame.native`).

``python -m frame_attention_cpu_paged.kernel`` builds it ahead of time (``make setup`` does).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from frame import native

NAME = "frame_cpu_paged"
SOURCES = (Path(__file__).parent / "csrc" / "paged_attention.cpp",)
CFLAGS = ("-O3", "-march=native")


@functools.cache  # hashes the source and reads /proc/cpuinfo: asked by every availability check
def unavailable_reason() -> str | None:
    """None when the kernel is built or can be built here; otherwise why not."""
    return native.unavailable_reason(NAME, SOURCES, CFLAGS)


def load() -> None:
    """Make ``torch.ops.frame_cpu_paged.attention`` available, building the library if needed."""
    native.load_library(NAME, SOURCES, CFLAGS)


if __name__ == "__main__":
    if reason := unavailable_reason():
        sys.exit(f"cpu_paged: not built: the kernel {reason}")
    load()
    print(f"cpu_paged kernel ready in {native.build_directory(NAME, SOURCES, CFLAGS)}")
