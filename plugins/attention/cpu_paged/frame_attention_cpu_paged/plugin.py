"""Hook implementations of the ``cpu_paged`` attention backend."""

from __future__ import annotations

import torch
from frame.hookspecs import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.platform import Platform
from pydantic import BaseModel

from frame_attention_cpu_paged import kernel

FRAME_API_VERSION = 2


@hookimpl
def frame_attention_platforms() -> list[str]:
    """A C++ kernel for the host CPU."""
    return ["cpu"]


@hookimpl
def frame_attention_check(platform: Platform) -> str | None:
    """Refuse when the kernel can be neither loaded from the cache nor built (no compiler or ninja)."""
    return kernel.unavailable_reason()


@hookimpl
def frame_attention_kv_dtypes() -> list[str]:
    """Every float dtype, and int8 / fp8 codes that the kernel quantizes on write and dequantizes on read."""
    return ["float32", "bfloat16", "float16", "int8", "fp8"]


@hookimpl
def frame_attention_create(
    num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype, platform: Platform,
    options: BaseModel | None, sliding_window: int | None, logit_softcap: float | None,
) -> AttentionBackend:
    """One CpuPagedAttention per attention spec (building the kernel first if this CPU has no build yet)."""
    from frame_attention_cpu_paged.backend import CpuPagedAttention

    return CpuPagedAttention(num_heads, num_kv_heads, head_dim, scale, dtype, sliding_window, logit_softcap)
