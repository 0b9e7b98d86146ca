"""Hook implementations of the ``gpt2`` model family: the shared family hooks over :class:`GPT2Args` and
:class:`GPT2Model`."""

from __future__ import annotations

from frame.layers.family import family_hooks

from frame_model_gpt2.model import ARCHITECTURES, GPT2Args, GPT2Model

FRAME_API_VERSION = 2

_hooks = family_hooks(ARCHITECTURES, GPT2Args.from_config, GPT2Model)
frame_model_architectures = _hooks.architectures
frame_plugin_options = _hooks.options
frame_model_attention = _hooks.attention
frame_model_create = _hooks.create
