"""Hooks of attention-backend plugins (entry-point group ``frame.attention``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    import torch

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
def frame_attention_kv_dtypes() -> list[str]:
    """The ``--kv-cache-dtype`` values this backend reads and writes (``["float32", "bfloat16", "float16", "int8",
    "fp8"]``); ``auto`` (the model's dtype) is always allowed.

    Called by ``frame plugins`` and before the model loads, which refuses an unsupported pair in one sentence
    naming the backends that support it. A quantized dtype means a pool whose rows are 8-bit codes followed by a
    float32 scale (:mod:`frame.interfaces.kv_dtype`); the backend sees it as its caches' dtype. Optional: a backend
    that does not implement it reads the float dtypes only. Since API 2 (issue 31).
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
    sliding_window: int | None,
    logit_softcap: float | None,
) -> AttentionBackend:
    """Create the backend that serves the attention layers of one spec (every layer, for most models).

    Called by the model worker, on the selected plugin, once per distinct
    :class:`~frame.interfaces.attention.AttentionSpec` the model family states, before the family builds its
    layers. Head counts are this tensor-parallel rank's share. ``dtype`` is the KV and compute dtype; ``scale`` the
    softmax scale. ``sliding_window`` (None: full causal attention) limits a query at position ``p`` to keys
    ``(p - sliding_window, p]``; ``logit_softcap`` (None: none) maps scores to ``c * tanh(score / c)`` before the
    softmax. A backend that does not implement one of them must not ignore it: pass both to
    :class:`~frame.interfaces.attention.AttentionBackend`'s constructor, which refuses what the backend does not
    declare, or raise :class:`~frame.interfaces.attention.UnsupportedAttentionError`; the core also refuses a
    backend whose instance does not report the window and soft-cap it was asked for. Since API 1 (``num_heads`` to
    ``options``); ``sliding_window`` and ``logit_softcap`` since API 2 (issue 18).
    """
