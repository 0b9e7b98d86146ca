"""Hook implementations of the ``qwen3`` model family (Qwen3, Qwen3-MoE, Qwen2-MoE): the shared family hooks over
:class:`QwenArgs` and :class:`QwenModel`."""

from __future__ import annotations

from frame.layers.family import family_hooks

from frame_model_qwen3.args import ARCHITECTURES, QwenArgs
from frame_model_qwen3.model import QwenModel

FRAME_API_VERSION = 2

_hooks = family_hooks(list(ARCHITECTURES.values()), QwenArgs.from_config, QwenModel)
frame_model_architectures = _hooks.architectures
frame_plugin_options = _hooks.options
frame_model_attention = _hooks.attention
frame_model_create = _hooks.create
