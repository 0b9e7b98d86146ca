"""frame's paged attention, plugged into transformers through its attention-function interface.

The model built with ``attn_implementation="frame_paged"`` calls :func:`paged_attention` from every attention
layer with that layer's rotated queries and keys; during a step it writes them into the layer's paged KV cache and
attends through the layer's backend (so continuous batching, chunked prefill and both prefix caches apply, as for a
native family). Outside a step (:func:`probing`) it runs transformers' own SDPA and records what each layer asked
for (scale, window, soft-cap), so the family can compare that with the specs it stated before serving anything.
Registering the name without a mask function tells transformers to build no attention mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from frame.interfaces.attention import AttentionBackend, AttentionMetadata, GroupedMetadata, layer_metadata
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "frame_paged"


@dataclass
class Step:
    """One forward's context: each layer's backend and KV cache and the step's metadata; ``meta`` None while
    probing, when ``asked`` collects each layer's ``(heads, kv_heads, head_dim, scale, sliding_window, softcap)``."""

    backends: list[AttentionBackend]
    caches: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    meta: AttentionMetadata | GroupedMetadata | None = None
    asked: dict[int, tuple[int, int, int, float, int | None, float | None]] = field(default_factory=dict)


_current: ContextVar[Step | None] = ContextVar("frame_paged_step", default=None)


@contextmanager
def stepping(step: Step) -> Iterator[Step]:
    """Run the model's attention layers through ``step``."""
    token = _current.set(step)
    try:
        yield step
    finally:
        _current.reset(token)


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    sliding_window: int | None = None, softcap: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[1, heads, tokens, head_dim]`` (the step's flat
    batch as one row), ``key``/``value`` ``[1, kv_heads, tokens, head_dim]``; returns ``[1, tokens, heads,
    head_dim]``."""
    step = _current.get()
    if step is None or step.meta is None:
        if step is not None:
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            step.asked[module.layer_idx] = (query.shape[1], key.shape[1], query.shape[-1], float(scale),
                                            sliding_window or None, softcap)
        return sdpa_attention_forward(module, query, key, value, None, scaling=scaling, dropout=0.0, **kwargs)
    layer = module.layer_idx
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    k_cache, v_cache = step.caches[layer]
    out = step.backends[layer].forward(q, k, v, k_cache, v_cache, layer_metadata(step.meta, layer))
    return out[None], None


AttentionInterface.register(NAME, paged_attention)
