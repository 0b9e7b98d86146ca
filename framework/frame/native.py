"""Native kernels of plugins: build a C++ source into a torch op library once, then load it in milliseconds.

A plugin that ships C++ (``TORCH_LIBRARY`` registrations, no Python bindings) calls :func:`load_library`. The
first call compiles its sources with torch's extension builder (ninja and a C++ compiler), tuned for this CPU, into
``$FRAME_CACHE_DIR/kernels/<name>-<digest>`` (default ``~/.cache/frame``); the digest pins the sources, the
flags, torch's version and the CPU's feature flags, so any change rebuilds and later processes just load.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from frame.paths import cache_root

_lock = threading.Lock()
_loaded: set[str] = set()


def missing_tools() -> str | None:
    """Why nothing can be built here (no C++ compiler or ninja), or None when it can."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"needs a C++ compiler to build its kernel, and '{compiler}' is not on PATH (install g++ or set CXX)"
    try:
        import ninja  # noqa: F401 - the pip package puts the binary beside the interpreter
    except ImportError:
        if shutil.which("ninja") is None:
            return "needs ninja to build its kernel (pip install ninja)"
    return None


def build_directory(name: str, sources: Sequence[Path], cflags: Sequence[str]) -> Path:
    """Where ``sources`` (and the ``.h`` files beside them) built with ``cflags`` for this torch and this CPU live."""
    digest = hashlib.sha256()
    flags = " ".join([*cflags, "-fopenmp"])
    # Headers beside the sources are part of the build too: editing one must rebuild.
    headers = sorted({h for s in sources for h in s.parent.glob("*.h")})
    for part in (*(f.read_bytes() for f in (*sources, *headers)), flags.encode(), torch.__version__.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):
        digest.update(part)
    return cache_root() / "kernels" / f"{name}-{digest.hexdigest()[:16]}"


def is_built(name: str, sources: Sequence[Path], cflags: Sequence[str]) -> bool:
    """True when a finished library for these sources, flags, torch and CPU is in the cache."""
    return (build_directory(name, sources, cflags) / f"{name}.so").is_file()


def unavailable_reason(name: str, sources: Sequence[Path], cflags: Sequence[str]) -> str | None:
    """None when the library is built or can be; otherwise why not (for a plugin's availability check)."""
    return None if is_built(name, sources, cflags) else missing_tools()


def load_library(name: str, sources: Sequence[Path], cflags: Sequence[str]) -> None:
    """Make the ops ``sources`` register available under ``torch.ops``, building the library first if needed.

    Safe to call from several threads and processes (the builder locks its folder); a no-op once loaded.
    """
    with _lock:
        if name in _loaded:
            return
        directory = build_directory(name, sources, cflags)
        library = directory / f"{name}.so"
        if library.is_file():
            torch.ops.load_library(str(library))
        else:
            from torch.utils import cpp_extension

            directory.mkdir(parents=True, exist_ok=True)
            # -fopenmp: torch's at::parallel_for is an OpenMP pragma in its headers, so without the flag a kernel
            # silently runs on one thread. The library then links libgomp.so.1, which resolves to the copy torch
            # already loaded, so both share one thread pool.
            cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=[*cflags, "-fopenmp"],
                               extra_ldflags=["-fopenmp"], build_directory=str(directory), is_python_module=False,
                               verbose=False)
        _loaded.add(name)


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()
