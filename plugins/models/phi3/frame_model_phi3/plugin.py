"""Hook implementations of the ``phi3`` model family: the shared family hooks over :class:`Phi3Args` and
:class:`Phi3Model`."""

from __future__ import annotations

from frame.layers.family import family_hooks

from frame_model_phi3.model import ARCHITECTURES, Phi3Args, Phi3Model

FRAME_API_VERSION = 2

_hooks = family_hooks(ARCHITECTURES, Phi3Args.from_config, Phi3Model)
frame_model_architectures = _hooks.architectures
frame_plugin_options = _hooks.options
frame_model_attention = _hooks.attention
frame_model_create = _hooks.create
