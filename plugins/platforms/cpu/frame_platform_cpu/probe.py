"""What this machine's CPU offers: cores, memory, bfloat16 instructions. Reads /proc and sysconf only."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

#: /proc/cpuinfo flags of CPUs with native bfloat16 arithmetic (x86 AVX-512 BF16 / AMX, Arm BF16).
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The feature flags of the first CPU in /proc/cpuinfo (``flags`` on x86, ``Features`` on Arm)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


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


def bf16_path() -> str | None:
    """How bfloat16 runs here: ``avx512_bf16`` (native dot products: the packed bfloat16 kernels), ``avx2``
    (bfloat16 storage, float32 arithmetic: AVX2 and FMA, which AVX-512 CPUs without BF16 have too), ``native``
    (Arm BF16, AMX without AVX-512 BF16: torch's own bfloat16 code), ``neon`` (Arm without BF16: storage only,
    torch's code), or None where bfloat16 would only be emulated slowly."""
    flags = cpu_flags()
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    if flags & _BF16_FLAGS:
        return "native"
    if "asimd" in flags:
        return "neon"
    return None


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
