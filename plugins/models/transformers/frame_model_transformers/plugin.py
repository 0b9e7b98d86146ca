"""Hook implementations of the ``transformers`` model family: the fallback for decoder-only architectures that no
native family claims.

The engine loads every model family to ask which one builds a checkpoint, so this module imports only transformers'
table of architectures; its modelling code (``model.py``, whose attention hook imports ``transformers.modeling_utils``
and with it triton, about 150 MiB resident) is imported when this family is the one chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from frame.hookspecs import hookimpl
from frame.layers import layer_backends
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

if TYPE_CHECKING:
    import torch
    from frame.interfaces.attention import AttentionBackend, AttentionSpec
    from frame.interfaces.model import CausalLM
    from transformers import PretrainedConfig

FRAME_API_VERSION = 2


@hookimpl
def frame_model_fallback() -> bool:
    """Chosen only when no native family lists the checkpoint's architecture."""
    return True


@hookimpl
def frame_model_architectures() -> list[str]:
    """Every causal-LM architecture the installed transformers maps (natives win where they overlap)."""
    return sorted(set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()))


@hookimpl
def frame_model_attention(hf_config: PretrainedConfig) -> list[AttentionSpec]:
    """Heads, scale, windows and soft-cap from the config; the loaded model is probed against them."""
    from frame_model_transformers.model import attention_specs

    return attention_specs(hf_config)


@hookimpl
def frame_model_create(hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device,
                       attention: AttentionBackend, layer_attention: list[AttentionBackend] | None) -> CausalLM:
    """transformers' modules for ``hf_config`` with frame's attention, weights not yet loaded."""
    from frame_model_transformers.model import TransformersModel, attention_specs

    backends = layer_backends(attention_specs(hf_config), attention, layer_attention)
    return TransformersModel(hf_config, backends, device, dtype)
