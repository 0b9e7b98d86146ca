"""Linear weights kept quantized: how packed checkpoint rows reach a layer, and what a layer runs without a kernel.

A quantization plugin's source hands a model family :class:`~frame.interfaces.quantization.PackedWeight` values
where it would hand dense tensors; the layers' ``load`` passes them here (:func:`store_rows`), which keeps each
block of rows on the weight parameter until every tensor is loaded.
:func:`~frame.layers.loading.finish_loading` then gathers the rows
into one packed weight per parameter (the fused QKV and gate-up layers hold several checkpoint tensors: a
:class:`~frame.weights.MixedRows` of them, not a joined copy), asks the quantization method to quantize the linear
weights that arrived dense (``int8``), and frees the dense storage of every weight that only linears, or a lookup
table reading packed rows (:func:`embedding_rows`), read. A table quantized at load keeps its dense values for
its lookups. The weight's packed form is ``weight.packed``; :func:`packed_weight` reads it for a platform.

A layer whose weight is packed runs the platform's kernel for its format; when the platform has none or declines
a call, :func:`with_reference` multiplies by the dequantised weight (slow, exact: the kernels' reference). A lookup
table kept packed asks the platform too (:func:`table_rows`), and without a kernel dequantizes the rows it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from frame.interfaces.quantization import PackedWeight
from frame.weights.mixed import MixedRows

log = logging.getLogger("frame.layers")


def packed_weight(layer: nn.Module) -> PackedWeight | None:
    """The packed form of ``layer.weight`` (None when the layer's weight is dense)."""
    return getattr(getattr(layer, "weight", None), "packed", None)


def embedding_rows(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.embedding(ids, weight)``, for a table kept packed too (``weight`` on the meta device, its blocks in
    ``weight.packed``: a GGUF's token embedding, tied or not): only the rows looked up are dequantized, each once,
    so the table stays the file's pages instead of a dense copy of the whole vocabulary."""
    packed = getattr(weight, "packed", None)
    if packed is None or weight.device.type != "meta":
        return torch.nn.functional.embedding(ids, weight)
    unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
    rows = packed.rows(unique.cpu()).dequantize(weight.dtype).to(ids.device)
    return rows[inverse].reshape(*ids.shape, rows.shape[-1])


def table_rows(layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Rows of a lookup table's ``layer.weight`` for ``ids``: the platform's kernel where it gave the table one
    (:meth:`~frame.interfaces.platform.Platform.layer_kernel`: the cpu platform reads a packed table's rows in one
    native op, which a recorded decode step can repeat) and it takes the call, else :func:`embedding_rows`."""
    kernel = getattr(layer, "kernel", None)
    if kernel is not None and (out := kernel(ids)) is not None:
        return out
    return embedding_rows(ids, layer.weight)


def store_rows(param: torch.Tensor, offset: int, packed: PackedWeight, what: str) -> None:
    """Keep ``packed`` as rows ``[offset, offset + rows)`` of the weight ``param`` until :func:`finish_loading`."""
    rows, inputs = packed.shape
    if param.dim() != 2 or inputs != param.shape[1] or offset + rows > param.shape[0]:
        raise ValueError(f"a checkpoint {what} of shape {tuple(packed.shape)} does not fit rows {offset}:"
                         f"{offset + rows} of {tuple(param.shape)}")
    param.__dict__.setdefault("packed_parts", {})[offset] = packed


def note_dense_rows(param: torch.Tensor, offset: int, rows: int) -> None:
    """Rows ``[offset, offset + rows)`` of a fused weight arrived dense (and are in ``param``): a GGUF may store
    one part of a fused layer in a format no plugin keeps packed (a k-quant file's q5_0 beside its q6_K)."""
    param.__dict__.setdefault("dense_rows", {})[offset] = rows


def joined_rows(param: torch.Tensor) -> PackedWeight | None:
    """The parameter's stored row blocks as one packed weight (a :class:`~frame.weights.MixedRows` when they differ
    in format; None when some rows arrived dense, so the weight goes dense)."""
    parts = param.__dict__.pop("packed_parts")
    dense = param.__dict__.pop("dense_rows", {})
    spans = sorted([(o, parts[o].shape[0]) for o in parts] + list(dense.items()))
    expected = 0
    for offset, rows in spans:
        if offset != expected:
            raise ValueError(f"rows {expected}:{offset} of a packed weight of shape {tuple(param.shape)} were never "
                             "loaded")
        expected += rows
    if expected != param.shape[0]:
        raise ValueError(f"rows {expected}:{param.shape[0]} of a packed weight were never loaded")
    ordered = [parts[o] for o in sorted(parts)]
    # Several parts stay as they are, one after another (each a view of the file's memory map, not joined into a
    # copy that would stay resident beside a kernel's own): the platform's kernel for the weight joins them if it
    # wants one matrix, and gives the file's pages back once it has its copy. Parts in different formats (a GGUF's
    # q6_K V beside q4_K Q and K) are kept each in its own.
    joined = None if dense else ordered[0] if len(ordered) == 1 else MixedRows(ordered)
    if joined is None:
        formats = [p.format for p in ordered] + ["dense"]
        log.info("a fused weight has rows that arrived dense (%s); it runs dense", ", ".join(formats))
        for o in sorted(parts):
            param.data[o : o + parts[o].shape[0]].copy_(parts[o].dequantize(param.dtype))
    return joined


def arrived_packed(param: torch.Tensor) -> bool:
    """True while ``param`` holds packed rows not yet joined (its dense values are not loaded)."""
    return "packed_parts" in param.__dict__


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters take, a packed weight counted at its packed size."""
    total = 0
    for param in model.parameters():
        if param.device.type == "meta":
            packed = getattr(param, "packed", None)
            total += packed.nbytes if packed is not None else 0
        else:
            total += param.numel() * param.element_size()
    return total


def with_reference(layer: nn.Module, kernel: Callable[..., Any] | None) -> Callable[..., Any]:
    """``kernel`` for a layer whose weight is packed, falling back to the dequantised weight when it is None or
    declines a call (the layer's dense computation, ``layer.dense_forward``, on ``PackedWeight.dequantize``)."""
    packed = packed_weight(layer)
    assert packed is not None, "with_reference serves layers whose weight is packed"
    if kernel is None:
        log.info("no kernel serves %s weights here; %s multiplies by the dequantised weight", packed.format,
                 type(layer).__name__)

    def run(x: torch.Tensor) -> torch.Tensor:
        out = kernel(x) if kernel is not None else None
        if out is None:
            out = layer.dense_forward(x, packed.dequantize(x.dtype))
        return out

    return run
