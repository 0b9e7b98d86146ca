"""Hooks of model-family plugins (entry-point group ``frame.models``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from frame.interfaces.attention import AttentionBackend, AttentionSpec
    from frame.interfaces.model import CausalLM



@hookspec
def frame_model_architectures() -> list[str]:
    """The Hugging Face ``architectures`` names this family builds (``["LlamaForCausalLM", ...]``).

    Called on every installed model plugin when a checkpoint is opened; the family that lists the
    checkpoint's first architecture builds it, and ``frame plugins`` shows the list. Since API 1.
    """


@hookspec
def frame_model_fallback() -> bool:
    """True for a fallback family: one that builds architectures only when no other installed family lists them.

    Optional (not answering means False). Called on every installed model plugin when a checkpoint is opened: the
    core first looks for the architecture among the families that are not fallbacks, then among the fallbacks,
    and says in its log and in ``frame plugins`` that a fallback was chosen. Since API 2 (issue 18).
    """


@hookspec
def frame_model_attention(hf_config: PretrainedConfig, options: BaseModel | None) -> list[AttentionSpec]:
    """The attention each layer of the model needs: one :class:`~frame.interfaces.attention.AttentionSpec` per
    layer, in layer order, with the model's global head counts (the core splits them over tensor-parallel ranks).

    Called by each model worker on the selected family once the checkpoint's config is read, before any attention
    backend exists. The core creates one backend per distinct spec and refuses, in one sentence and before any
    weight is read, a backend that does not implement a layer's sliding window or soft-cap. Every layer must have
    the same head counts and head size (the KV pool is one tensor); scale, window, soft-cap and KV sharing may
    differ. ``options`` is the family's validated options (``--model-opt``), or None. Raise
    :class:`~frame.errors.UnsupportedModelError` naming the config field for anything the family does not
    implement. Optional: without it every layer gets full attention over the config's ``num_attention_heads``,
    ``num_key_value_heads`` and ``head_dim`` with scale ``head_dim ** -0.5``. Since API 2 (issue 18).
    """


@hookspec
def frame_model_create(
    hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device, attention: AttentionBackend,
    layer_attention: list[AttentionBackend] | None, options: BaseModel | None,
) -> CausalLM:
    """Build the network for ``hf_config`` with parameters of ``dtype`` on ``device``, weights not yet loaded.

    Called once by the model worker, on the family chosen by architecture, after the attention backends were
    created. ``layer_attention[i]`` is the backend layer ``i`` must call (made from the family's
    :func:`frame_model_attention` spec for that layer, heads already split for this rank; layers with equal specs
    share one); ``attention`` is the first layer's. A caller that passes only ``attention`` (``layer_attention``
    None) means it for every layer: the family must then check that it matches every layer's spec and raise
    ValueError otherwise. ``options`` is the family's validated options, or None. Since API 1 (``attention``);
    ``layer_attention`` and ``options`` since API 2 (issue 18).
    """
