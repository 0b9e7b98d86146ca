"""Hooks of the ``triton`` attention plugin. Triton and the kernels are imported only when a backend is made."""

from __future__ import annotations

import importlib.util
import os

import torch
from frame.hookspecs import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.platform import Platform
from pydantic import BaseModel

FRAME_API_VERSION = 2

PLATFORMS = ["cuda", "rocm"]


def _interpreted() -> bool:
    """Under ``TRITON_INTERPRET=1`` the kernels run (slowly) on CPU tensors: how the tests run without a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@hookimpl
def frame_attention_platforms() -> list[str]:
    return [*PLATFORMS, "cpu"] if _interpreted() else list(PLATFORMS)


@hookimpl
def frame_attention_check(platform: Platform) -> str | None:
    if platform.name not in frame_attention_platforms():
        return (f"the triton kernels run on a CUDA or ROCm GPU, not on the '{platform.name}' platform "
                "(on the CPU only under TRITON_INTERPRET=1, for tests)")
    if importlib.util.find_spec("triton") is None:
        return "the triton package is not installed; pip install triton"
    return None


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    from frame_attention_triton.options import TritonOptions

    return TritonOptions


@hookimpl
def frame_attention_create(num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
                           options: BaseModel | None, sliding_window: int | None,
                           logit_softcap: float | None) -> AttentionBackend:
    from frame_attention_triton.backend import TritonAttentionBackend
    from frame_attention_triton.options import TritonOptions

    return TritonAttentionBackend(num_heads, num_kv_heads, head_dim, scale, dtype,
                                  options if isinstance(options, TritonOptions) else None, sliding_window,
                                  logit_softcap)
