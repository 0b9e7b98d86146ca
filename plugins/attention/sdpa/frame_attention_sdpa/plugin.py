"""Hook implementations of the ``sdpa`` attention backend."""

from __future__ import annotations

import torch
from frame.hookspecs import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.platform import Platform
from pydantic import BaseModel

from frame_attention_sdpa.backend import SdpaAttention

FRAME_API_VERSION = 2


@hookimpl
def frame_attention_platforms() -> list[str]:
    """Plain torch ops: runs wherever torch does."""
    return ["cpu", "cuda", "rocm"]


@hookimpl
def frame_attention_kv_dtypes() -> list[str]:
    """Every float dtype, and int8/fp8 rows dequantized as they are gathered."""
    return ["float32", "bfloat16", "float16", "int8", "fp8"]


@hookimpl
def frame_attention_create(
    num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype, platform: Platform,
    options: BaseModel | None, sliding_window: int | None, logit_softcap: float | None,
) -> AttentionBackend:
    """One SdpaAttention per attention spec; it takes no options and needs nothing from the platform."""
    return SdpaAttention(num_heads, num_kv_heads, head_dim, scale, dtype, sliding_window, logit_softcap)
