"""Hook implementations of the ``llama`` model family (Llama, Mistral, Qwen2, Granite, Mixtral and their
fine-tunes): the shared family hooks over :class:`LlamaArgs` and :class:`LlamaModel`."""

from __future__ import annotations

from frame.layers.family import family_hooks

from frame_model_llama.args import ARCHITECTURES, LlamaArgs
from frame_model_llama.model import LlamaModel

FRAME_API_VERSION = 2

_hooks = family_hooks(list(ARCHITECTURES), LlamaArgs.from_config, LlamaModel)
frame_model_architectures = _hooks.architectures
frame_plugin_options = _hooks.options
frame_model_attention = _hooks.attention
frame_model_create = _hooks.create
