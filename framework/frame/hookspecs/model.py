"""Hooks of model-family plugins (entry-point group ``frame.models``)."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from frame.hookspecs import hookspec
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.model import CausalLM


@hookspec
def frame_model_architectures() -> list[str]:
    """The Hugging Face ``architectures`` names this family builds (``["LlamaForCausalLM", ...]``).

    Called on every installed model plugin when a checkpoint is opened; the family that lists the
    checkpoint's first architecture builds it. Since API 1.
    """


@hookspec
def frame_model_create(
    hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device, attention: AttentionBackend
) -> CausalLM:
    """Build the network for ``hf_config`` with parameters of ``dtype`` on ``device``, weights not yet loaded.

    Called once by the model runner, on the family chosen by architecture, after the attention backend was
    created; every attention layer must call ``attention``. Since API 1.
    """
