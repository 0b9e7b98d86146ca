"""finish_loading: the step after a family's ``load_weights`` that leaves every linear weight in its final form.

Packed rows that arrived per checkpoint tensor are joined (:mod:`frame.layers.quantized`), dense linear weights
are quantized by the selected method, and dense storage that only linears read is freed. It sits above both the
layers (:mod:`frame.layers.basic`) and the packed-weight plumbing, which therefore need not import each other.
"""

from __future__ import annotations

import torch
from torch import nn

from frame.interfaces.quantization import QuantizationMethod
from frame.layers.basic import Linear
from frame.layers.moe import FusedExperts
from frame.layers.quantized import arrived_packed, joined_rows


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, Linear)


def _reads_packed(module: nn.Module, packed: object) -> bool:
    """True for a layer that computes from ``packed`` alone: a linear, or a lookup table that dequantizes the rows
    it looks up (the token embedding, tied to the LM head or not); a table of parts in several formats is kept
    dense."""
    return _is_linear(module) or (getattr(module, "reads_packed_rows", False)
                                   and getattr(packed, "format", "mixed") != "mixed")


def finish_loading(model: nn.Module, method: QuantizationMethod | None,
                   input_absmax: dict[str, torch.Tensor] | None = None) -> int:
    """After ``model.load_weights``: join packed rows, quantize dense linear weights with ``method``, and free the
    dense storage that only linears would read. Returns how many weights are packed. ``input_absmax`` (module path
    to its largest ``|x|`` per input feature, :mod:`frame.engine.worker.calibration`) goes to a method that
    calibrates."""
    for module in model.modules():
        if isinstance(module, FusedExperts):
            module.finish_packed()
    users: dict[int, list[tuple[str, nn.Module]]] = {}
    weights: dict[int, nn.Parameter] = {}
    for path, module in model.named_modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            users.setdefault(id(weight), []).append((path, module))
            weights[id(weight)] = weight
    packed_count = 0
    for key, weight in weights.items():
        holders = users[key]
        if not arrived_packed(weight):
            weight.__dict__.pop("dense_rows", None)
        arrived = arrived_packed(weight)
        packed = joined_rows(weight) if arrived else None
        if packed is None and method is not None and weight.dim() == 2 and any(_is_linear(m) for _, m in holders):
            path = next(p for p, m in holders if _is_linear(m))
            if input_absmax is None:  # a method that does not calibrate may predate the argument
                packed = method.quantize(path, weight.data)
            else:
                packed = method.quantize(path, weight.data, input_absmax=input_absmax.get(path))
        if packed is None:
            continue
        packed_count += 1
        readers = _reads_packed if arrived else (lambda module, _: _is_linear(module))
        if all(readers(m, packed) for _, m in holders):  # nothing reads dense values: keep shape and dtype only
            replacement = nn.Parameter(torch.empty(weight.shape, dtype=weight.dtype, device="meta"),
                                       requires_grad=False)
            replacement.packed = packed
            for _, module in holders:
                module.weight = replacement
        else:  # a table quantized here (int8): it looks rows up dense; the linears sharing it read the packed form
            if arrived:
                weight.data.copy_(packed.dequantize(weight.dtype))
            weight.packed = packed
    return packed_count
