"""Native kernels of plugins: build a C++ source into a torch op library once, then load it in milliseconds.

A plugin that ships C++ (``TORCH_LIBRARY`` registrations, no Python bindings) calls :func:`load_library`. The
first call compiles its sources with torch's extension builder (ninja and a C++ compiler), tuned for this CPU, into
``$FRAME_CACHE_DIR/kernels/<name>-<digest>`` (default ``~/.cache/frame``); the digest pins the sources, the
flags, torch's version and the CPU's feature flags, so any change rebuilds and later processes just load. Each load
marks its build used, and a new build removes those no process has loaded for a month (:mod:`frame.derived_cache`).

Every build has the core's headers on its include path (:data:`INCLUDE_DIR`): ``frame/team_form.h``, the contract by
which one library's op runs on the threads of another's parallel region (docs/plugins.md, "Native team forms").

``FRAME_CPU_DISABLE`` (``/proc/cpuinfo`` flag names, comma-separated, e.g. ``avx512_bf16`` or ``avx512f``) makes
this machine stand in for a lesser CPU class: :func:`cpu_flags` leaves those flags out (and those that need them),
and every library is built without their instructions (``-mno-avx512bf16`` ...). The kernels and probes of that
class then run here for real, on this CPU's silicon: that is how the AVX-512-without-BF16 and AVX2-only paths are
tested and measured on an AVX-512 BF16 machine. Their speed is this CPU's, not that class's.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from frame.derived_cache import mark_used, sweep_unused_builds
from frame.errors import ConfigError
from frame.paths import cache_root

#: Headers the core offers native plugin code (``#include <frame/team_form.h>``): on every library's include path.
INCLUDE_DIR = Path(__file__).parent / "include"

_lock = threading.Lock()
_loaded: set[str] = set()

#: The environment variable naming CPU flags to do without (see the module's docstring).
DISABLE_ENV = "FRAME_CPU_DISABLE"

#: GCC's switch for each flag it can build without, and the flags that go with it (their instructions need it).
_WITHOUT: dict[str, tuple[str, tuple[str, ...]]] = {
    "avx2": ("-mno-avx2", ("avx512f", "fma")),
    "fma": ("-mno-fma", ("avx512f",)),
    "avx512f": ("-mno-avx512f", ("avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_vnni", "avx512_bf16",
                                 "avx512_fp16", "avx512vbmi", "avx512_vbmi2", "avx512ifma", "avx512_bitalg",
                                 "avx512_vpopcntdq", "avx512_vp2intersect", "amx_tile")),
    "avx512bw": ("-mno-avx512bw", ("avx512_bf16", "avx512_fp16", "avx512vbmi", "avx512_vbmi2", "avx512_bitalg")),
    "avx512_vnni": ("-mno-avx512vnni", ()),
    "avx512_bf16": ("-mno-avx512bf16", ("amx_tile",)),
    "avx512_fp16": ("-mno-avx512fp16", ()),
    "amx_tile": ("-mno-amx-tile", ("amx_bf16", "amx_int8")),
    "amx_bf16": ("-mno-amx-bf16", ()),
    "amx_int8": ("-mno-amx-int8", ()),
}


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


def disabled_cpu_flags() -> frozenset[str]:
    """The CPU flags ``FRAME_CPU_DISABLE`` names, with those that depend on them; empty when it is unset.

    Raises ConfigError, naming the flags it knows, for any other name: ignoring it would leave the kernels built
    for a CPU class nobody asked for (``amx`` for ``amx_tile`` once turned every native kernel off unseen).
    """
    named = {f.strip() for f in os.environ.get(DISABLE_ENV, "").split(",") if f.strip()}
    unknown = sorted(named - _WITHOUT.keys())
    if unknown:
        what = "which is not a CPU flag" if len(unknown) == 1 else "which are not CPU flags"
        raise ConfigError(f"{DISABLE_ENV} names {', '.join(unknown)}, {what} frame can build without; name some "
                          f"of {', '.join(sorted(_WITHOUT))} (comma-separated), or unset it.", param=DISABLE_ENV)
    disabled: set[str] = set()
    pending = list(named)
    while pending:
        flag = pending.pop()
        if flag not in disabled:
            disabled.add(flag)
            pending.extend(_WITHOUT.get(flag, ("", ()))[1])
    return frozenset(disabled)


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (``flags`` on x86, ``Features`` on Arm, from the first CPU in /proc/cpuinfo), less
    those ``FRAME_CPU_DISABLE`` takes away: what probes that choose a kernel path should read."""
    return _proc_cpu_flags() - disabled_cpu_flags()


def _without_switches() -> list[str]:
    """GCC switches that keep the disabled flags' instructions out of a build."""
    return [_WITHOUT[f][0] for f in sorted(disabled_cpu_flags()) if f in _WITHOUT]


def build_directory(name: str, sources: Sequence[Path], cflags: Sequence[str]) -> Path:
    """Where ``sources`` (and the ``.h`` files beside them) built with ``cflags`` for this torch and this CPU live."""
    digest = hashlib.sha256()
    flags = " ".join([*cflags, *_without_switches(), "-fopenmp"])
    # Headers beside the sources and the core's are part of the build too: editing one must rebuild.
    headers = sorted({h for s in sources for h in s.parent.glob("*.h")} | set(INCLUDE_DIR.rglob("*.h")))
    for part in (*(f.read_bytes() for f in (*sources, *headers)), flags.encode(), torch.__version__.encode(),
                 platform.machine().encode(), (" ".join(sorted(cpu_flags())) or platform.processor()).encode()):
        digest.update(part)
    return cache_root() / "kernels" / f"{name}-{digest.hexdigest()[:16]}"


def is_built(name: str, sources: Sequence[Path], cflags: Sequence[str]) -> bool:
    """True when a finished library for these sources, flags, torch and CPU is in the cache."""
    return (build_directory(name, sources, cflags) / f"{name}.so").is_file()


def unavailable_reason(name: str, sources: Sequence[Path], cflags: Sequence[str]) -> str | None:
    """None when the library is built or can be; otherwise why not (for a plugin's availability check).

    A ``FRAME_CPU_DISABLE`` naming an unknown flag raises its ConfigError rather than becoming a reason: a
    misspelt flag is the user's to fix, not a machine without kernels.
    """
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
            cpp_extension.load(name=name, sources=[str(s) for s in sources],
                               extra_cflags=[*cflags, *_without_switches(), "-fopenmp"],
                               extra_ldflags=["-fopenmp"], extra_include_paths=[str(INCLUDE_DIR)],
                               build_directory=str(directory), is_python_module=False,
                               verbose=False)
            sweep_unused_builds(directory.parent)
        mark_used(directory)
        _loaded.add(name)


@functools.cache
def _proc_cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()
