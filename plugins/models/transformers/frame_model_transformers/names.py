"""Checkpoint names to the parameter names of transformers' modules.

Checkpoints keep the names models had when they were saved; transformers 5 renames some on load (GPT-NeoX's
``embed_out`` is ``lm_head``) and merges others (experts into 3-D stacks). :func:`renamer` applies the model's own
renamings; a merge is beyond a tensor-by-tensor loader, so a tensor that needs one is refused in one sentence.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from frame.errors import UnsupportedModelError


def renamer(model: torch.nn.Module, architecture: str) -> Callable[[str], str]:
    """A function from checkpoint names to ``model``'s state-dict names (identity without transformers' mapping)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming, apply_renamings
    except ImportError:  # a transformers without conversion mappings names parameters as checkpoints do
        return lambda name: name
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]

    def rename(name: str) -> str:
        renamed = apply_renamings(name, renamings)
        for converter in converters:
            if converter.rename_source_key(renamed)[1] is not None:
                raise UnsupportedModelError(
                    f"Checkpoint tensor {name!r} of {architecture} must be merged with others on load, which the "
                    "transformers fallback family does not do; no native family builds it.", param="model")
        return renamed

    return rename
