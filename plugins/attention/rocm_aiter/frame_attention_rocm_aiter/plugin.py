"""Hooks of the ``rocm_aiter`` attention plugin. ``aiter`` is imported by the check and by the backend only."""

from __future__ import annotations

import importlib

import torch
from frame.hookspecs import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.platform import Platform

FRAME_API_VERSION = 2

PLATFORMS = ["rocm"]


def aiter_import_error() -> str | None:
    """None when ``aiter`` imports, otherwise the import error's message (``"No module named 'aiter'"``)."""
    try:
        importlib.import_module("aiter")
    except Exception as err:  # AITER's JIT import can fail in many ways; every one means "cannot run"
        return str(err) or type(err).__name__
    return None


@hookimpl
def frame_attention_platforms() -> list[str]:
    return list(PLATFORMS)


@hookimpl
def frame_attention_check(platform: Platform) -> str | None:
    if platform.name not in PLATFORMS:
        return f"AITER's kernels run on AMD GPUs (the rocm platform), not on the '{platform.name}' platform"
    error = aiter_import_error()
    if error is not None:
        return f"the aiter package does not import: {error}"
    return None


@hookimpl
def frame_attention_create(num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
                           sliding_window: int | None, logit_softcap: float | None) -> AttentionBackend:
    """One AiterAttentionBackend per attention spec; a window or soft-cap is refused (not wired to AITER yet)."""
    from frame_attention_rocm_aiter.backend import AiterAttentionBackend

    return AiterAttentionBackend(num_heads, num_kv_heads, head_dim, scale, dtype, sliding_window, logit_softcap)
