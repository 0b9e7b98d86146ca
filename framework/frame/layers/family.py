"""The hooks of a model-family plugin, made from the family's config reader and its model class.

Most families answer the model hooks the same way: list their architectures, take :class:`FamilyOptions`, state
each layer's attention from their args, and build their model from the args and the backends. A plugin module binds
what :func:`family_hooks` returns to the hook names (pluggy reads them from the module):

    _hooks = family_hooks(ARCHITECTURES, MyArgs.from_config, MyModel)
    frame_model_architectures = _hooks.architectures
    frame_plugin_options = _hooks.options
    frame_model_attention = _hooks.attention
    frame_model_create = _hooks.create

A family whose hooks differ writes them as plain ``@hookimpl`` functions instead (see ``frame.hookspecs.model``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from pydantic import BaseModel
from transformers import PretrainedConfig

from frame.hookspecs import hookimpl
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.interfaces.model import CausalLM
from frame.layers.config import FamilyOptions


class FamilyArgs(Protocol):
    """What a family reads from a config: at least each layer's attention."""

    def attention_specs(self) -> list[AttentionSpec]: ...


#: ``(args, attention, device, dtype, layer_attention) -> CausalLM``: the family's model class, or a function.
Build = Callable[[Any, AttentionBackend, torch.device, torch.dtype, list[AttentionBackend] | None], CausalLM]


@dataclass(frozen=True)
class FamilyHooks:
    """The four hook implementations, to bind to ``frame_model_architectures``, ``frame_plugin_options``,
    ``frame_model_attention`` and ``frame_model_create`` in the plugin module."""

    architectures: Callable[[], list[str]]
    options: Callable[[], type[BaseModel]]
    attention: Callable[[PretrainedConfig, BaseModel | None], list[AttentionSpec]]
    create: Callable[..., CausalLM]


def family_hooks(architectures: Sequence[str], read: Callable[[PretrainedConfig, BaseModel | None], FamilyArgs],
                 build: Build, options_model: type[BaseModel] = FamilyOptions) -> FamilyHooks:
    """Hooks that list ``architectures``, take ``options_model``, and answer from ``read(config, options)``."""

    @hookimpl
    def frame_model_architectures() -> list[str]:
        """The Hugging Face architectures this family builds."""
        return list(architectures)

    @hookimpl
    def frame_plugin_options() -> type[BaseModel]:
        """The family's options (``--model-opt``)."""
        return options_model

    @hookimpl
    def frame_model_attention(hf_config: PretrainedConfig, options: BaseModel | None) -> list[AttentionSpec]:
        """Each layer's attention, from the family's reading of the config."""
        return read(hf_config, options).attention_specs()

    @hookimpl
    def frame_model_create(hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device,
                           attention: AttentionBackend, layer_attention: list[AttentionBackend] | None,
                           options: BaseModel | None) -> CausalLM:
        """The unloaded model; UnsupportedModelError for a config this family cannot build."""
        return build(read(hf_config, options), attention, device, dtype, layer_attention)

    return FamilyHooks(frame_model_architectures, frame_plugin_options, frame_model_attention, frame_model_create)
