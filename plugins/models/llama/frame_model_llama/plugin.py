"""Hook implementations of the ``llama`` model family (Llama, Mistral, Qwen2 and their fine-tunes)."""

from __future__ import annotations

import torch
from frame.hookspecs import hookimpl
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.model import CausalLM
from transformers import PretrainedConfig

from frame_model_llama.args import ARCHITECTURES, LlamaArgs
from frame_model_llama.model import LlamaModel

FRAME_API_VERSION = 2


@hookimpl
def frame_model_architectures() -> list[str]:
    """The Hugging Face architectures this family builds."""
    return list(ARCHITECTURES)


@hookimpl
def frame_model_create(
    hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device, attention: AttentionBackend
) -> CausalLM:
    """An unloaded LlamaModel for ``hf_config``; ValueError for a config this family cannot build."""
    return LlamaModel(LlamaArgs.from_config(hf_config), attention, device, dtype)
