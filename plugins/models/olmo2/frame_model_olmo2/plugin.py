"""Hook implementations of the ``olmo2`` model family: the shared family hooks over :class:`Olmo2Args` and
:class:`Olmo2Model`."""

from __future__ import annotations

from frame.layers.family import family_hooks

from frame_model_olmo2.model import ARCHITECTURES, Olmo2Args, Olmo2Model

FRAME_API_VERSION = 2

_hooks = family_hooks(ARCHITECTURES, Olmo2Args.from_config, Olmo2Model)
frame_model_architectures = _hooks.architectures
frame_plugin_options = _hooks.options
frame_model_attention = _hooks.attention
frame_model_create = _hooks.create
