"""Hooks of attention-backend plugins (entry-point group ``frame.attention``)."""

from __future__ import annotations

import torch
from pydantic import BaseModel

from frame.hookspecs import hookspec
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.platform import Platform


@hookspec
def frame_attention_platforms() -> list[str]:
    """Names of the platforms this backend runs on (``["cpu", "cuda", "rocm"]``).

    Called by ``frame plugins``, by ``--attn auto`` and before the model loads, to refuse a backend that cannot
    run on the selected platform with a message that lists the installed backends that can. Since API 1.
    """


@hookspec
def frame_attention_check(platform: Platform) -> str | None:
    """A finer check than :func:`frame_attention_platforms`: can this backend run on ``platform`` here?

    Called after the platform was created, before the model loads. Returns None when it can, otherwise one
    sentence saying why not (``"the aiter package does not import: No module named 'aiter'"``). Optional:
    a backend that does not implement it is judged by its platform list alone. Since API 1.
    """


@hookspec
def frame_attention_create(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    dtype: torch.dtype,
    platform: Platform,
    options: BaseModel | None,
) -> AttentionBackend:
    """Create the backend that serves every attention layer of the model.

    Called once by the model runner, on the selected plugin, before the model family builds its layers.
    ``dtype`` is the KV and compute dtype; ``scale`` the softmax scale. Since API 1.
    """
