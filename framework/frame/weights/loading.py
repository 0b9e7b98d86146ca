"""Loading a checkpoint into a model family's layers: every tensor to its layer, every layer filled exactly once.

A family turns each checkpoint tensor into placements ``((module path, kind, part), tensor)`` (its name map, see
:mod:`frame.weights.names`; a fused tensor may become several placements, a 3-D stack of experts one per expert);
:func:`load_checkpoint` hands each to the module's ``load(kind, tensor, part)`` (which keeps its tensor-parallel
slice) and checks that nothing is missing and nothing is unknown. Modules take part by having ``load`` and either
``load_parts()`` (the parts of their ``weight`` and ``bias``) or ``load_targets()`` (their ``(kind, part)`` pairs).
A layer whose weight is another layer's parameter (tied embeddings) is filled by that layer, never twice.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from frame.interfaces.model import WeightSource

#: ``(module path, kind, part)``: the layer, ``weight`` or ``bias`` (or a kind of the layer's own), the fused part.
Target = tuple[str, str, str | None]
#: Where one checkpoint tensor (or a piece of it) goes.
Placement = tuple[Target, torch.Tensor]
#: A family's mapping: ``(name, tensor)`` -> placements, or None to skip the tensor; ValueError for an unknown one.
Placer = Callable[[str, torch.Tensor], list[Placement] | None]


def _loadable(module: nn.Module) -> bool:
    return hasattr(module, "load") and (hasattr(module, "load_targets") or hasattr(module, "load_parts"))


def tied_paths(model: nn.Module) -> set[str]:
    """Paths of loadable modules whose ``weight`` is a parameter an earlier module holds (tied embeddings)."""
    seen: set[int] = set()
    tied = set()
    for path, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not _loadable(module) or not isinstance(weight, torch.Tensor):
            continue
        if id(weight) in seen:
            tied.add(path)
        seen.add(id(weight))
    return tied


def expected_targets(model: nn.Module) -> set[Target]:
    """Every ``(module, kind, part)`` a checkpoint must fill."""
    expected: set[Target] = set()
    tied = tied_paths(model)
    for path, module in model.named_modules():
        if not _loadable(module) or path in tied:
            continue
        targets = getattr(module, "load_targets", None)
        if targets is not None:
            expected.update((path, kind, part) for kind, part in targets())
            continue
        kinds = [k for k in ("weight", "bias") if getattr(module, k, None) is not None]
        if getattr(module, "summed_bias", None) is not None:  # a row-parallel layer adds its bias after the sum
            kinds.append("bias")
        expected.update((path, kind, part) for kind in kinds for part in module.load_parts())
    return expected


@torch.inference_mode()
def load_checkpoint(model: nn.Module, source: WeightSource, place: Placer, what: str = "this model") -> None:
    """Hand every tensor of ``source`` to its layer through ``place``; ValueError naming the checkpoint tensor for
    one that has no place or does not fit, and naming the layers a checkpoint left empty."""
    modules = dict(model.named_modules())
    expected = expected_targets(model)
    tied = tied_paths(model)
    for name, tensor in source.tensors():
        placements = place(name, tensor)
        for target, piece in placements or ():
            path, kind, part = target
            if path in tied:
                continue  # filled through the layer it is tied to
            module = modules.get(path)
            if module is None or not _loadable(module):
                raise ValueError(f"checkpoint tensor {name!r} has no place in {what}")
            try:
                module.load(kind, piece, part)
            except ValueError as err:
                raise ValueError(f"checkpoint tensor {name!r}: {err}") from None
            expected.discard(target)
    if expected:
        missing = ", ".join(sorted(f"{p}.{k}" + (f"[{part}]" if part else "") for p, k, part in expected))
        raise ValueError(f"the checkpoint lacks tensors for: {missing}")
