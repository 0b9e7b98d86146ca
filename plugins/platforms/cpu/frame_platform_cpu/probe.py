"""What this machine's CPU offers: cores, memory, bfloat16 instructions. Reads /proc and sysconf only."""

from __future__ import annotations

import os
from pathlib import Path

from frame import native

#: /proc/cpuinfo flags of CPUs with native bfloat16 arithmetic (x86 AVX-512 BF16 / AMX, Arm BF16).
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
#: (limit, usage) file pairs of cgroup v2 and v1.
_CGROUP_USAGE = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def cpu_flags() -> frozenset[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (``flags`` on x86, ``Features`` on Arm), less those
    ``FRAME_CPU_DISABLE`` takes away to stand in for a lesser CPU class (:mod:`frame.native`)."""
    return native.cpu_flags()


def has_bf16() -> bool:
    """True when the CPU computes bfloat16 natively (so bfloat16 is not just a slow emulation)."""
    return bool(cpu_flags() & _BF16_FLAGS)


def has_fast_bf16() -> bool:
    """True on x86 CPUs with AVX-512 BF16 or AMX, where oneDNN's bfloat16 matmuls beat float32 ones."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def has_avx512_bf16() -> bool:
    """True on x86 CPUs with AVX-512 BF16 ``vdpbf16ps``, which the packed linear kernel is written in."""
    return "avx512_bf16" in cpu_flags()


def has_avx2_fma() -> bool:
    """True on x86 CPUs with AVX2 and FMA, which the packed float32 linear kernel is written in."""
    return {"avx2", "fma"} <= cpu_flags()


def has_avx512() -> bool:
    """True on x86 CPUs with AVX-512 F, BW and VL (Skylake-SP and later Xeons, Zen 4 and later): the packed float32
    linear runs sixteen lanes wide there, and the norm, SwiGLU and rotary kernels their AVX-512 loops."""
    return {"avx512f", "avx512bw", "avx512vl", "avx2", "fma"} <= cpu_flags()


def bf16_path() -> str | None:
    """How bfloat16 runs here: ``avx512_bf16`` (native dot products: the packed bfloat16 kernels), ``avx512``
    (bfloat16 storage, float32 arithmetic on AVX-512: Xeons before Cooper Lake), ``avx2`` (the same on AVX2 and
    FMA), ``native`` (Arm BF16, AMX without AVX-512 BF16: torch's own bfloat16 code), ``neon`` (Arm without BF16:
    storage only, torch's code), or None where bfloat16 would only be emulated slowly."""
    flags = cpu_flags()
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if has_avx512():
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    if flags & _BF16_FLAGS:
        return "native"
    if "asimd" in flags:
        return "neon"
    return None


#: bfloat16 paths that store bfloat16 and compute in float32 with the packed float32 linear.
STORAGE_PATHS = frozenset({"avx512", "avx2"})


def has_amx() -> bool:
    """True when the CPU has AMX tiles for bfloat16, where bfloat16 matmuls clearly beat float32."""
    return "amx_bf16" in cpu_flags()


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which respects taskset and containers)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def total_memory_bytes() -> int:
    """Physical memory, lowered to the cgroup's limit when the process runs in a smaller container."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in _CGROUP_LIMITS:
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            total = min(total, int(raw))
    return total


def available_memory_bytes() -> int:
    """Memory the kernel could give this process now without swapping (``MemAvailable``: free pages plus the
    page cache it can drop, a memory-mapped file's pages included), lowered to the cgroup's room when the
    process runs in a smaller container."""
    available = total_memory_bytes()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = min(available, int(line.split()[1]) * 1024)
    except OSError:  # not on Linux: the total is the best guess
        pass
    for limit_file, usage_file in _CGROUP_USAGE:
        try:
            limit, usage = (Path(f).read_text().strip() for f in (limit_file, usage_file))
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit():
            available = min(available, max(int(limit) - int(usage), 0))
    return available
