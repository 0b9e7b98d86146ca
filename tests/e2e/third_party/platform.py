"""PlainCpuPlatform: the host CPU with torch's own kernels (an author's fill-in of the skeleton)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from frame.errors import ConfigError
from frame.interfaces.platform import Platform

#: The KV pool never takes more than this, whatever the memory fraction allows.
_KV_CAP_BYTES = 1 << 30


class PlainCpuPlatform(Platform):
    """float32 on the CPU, no native kernels; prefers the gather backend when it is installed."""

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def supported_dtypes(self) -> Sequence[torch.dtype]:
        return (torch.float32,)

    def describe(self) -> str:
        return f"plain CPU ({os.cpu_count()} cores, torch kernels)"

    def kv_cache_budget_bytes(self, memory_fraction: float, model_bytes: int) -> int:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        share = int(memory_fraction * ram) - model_bytes
        if share <= 0:
            raise ConfigError(f"kv_cache_fraction {memory_fraction} of RAM does not hold the weights; raise it.",
                              param="kv_cache_fraction")
        return min(share, _KV_CAP_BYTES)

    def preferred_attention(self, installed: Sequence[str]) -> str:
        for name in ("gather", "sdpa"):
            if name in installed:
                return name
        if not installed:
            raise ConfigError("No attention backend is installed; install frame-attention-gather.", param="attn")
        return sorted(installed)[0]
