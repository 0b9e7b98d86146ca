"""Hook implementations of the ``gemma`` model family (Gemma, Gemma 2, Gemma 3 text): the shared family hooks
over :class:`GemmaArgs` and :class:`GemmaModel`."""

from __future__ import annotations

from frame.layers.family import family_hooks

from frame_model_gemma.args import ARCHITECTURES, GemmaArgs
from frame_model_gemma.model import GemmaModel

FRAME_API_VERSION = 2

_hooks = family_hooks(list(ARCHITECTURES.values()), GemmaArgs.from_config, GemmaModel)
frame_model_architectures = _hooks.architectures
frame_plugin_options = _hooks.options
frame_model_attention = _hooks.attention
frame_model_create = _hooks.create
