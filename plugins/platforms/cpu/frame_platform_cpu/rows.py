"""Rows of a lookup table kept packed (a GGUF's token embedding, tied to the LM head or not), for the ids looked up.

``csrc/packed_rows.cpp`` dequantizes the rows the ids name straight from the table's blocks (the file's memory map),
bit for bit gguf's dequantisation rounded to the table's dtype, in one op call: the core's reference
(:func:`frame.layers.quantized.embedding_rows`) reads the ids back to Python (``unique``) and dequantizes through
numpy, neither of which a recorded decode step can repeat, so a model whose table stays packed recorded no decode
step before this. The table is never made dense.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from frame.interfaces.quantization import PackedWeight

from frame_platform_cpu import kernels, kquant, quantized

#: Formats whose rows ``packed_rows`` reads: every ggml block format the linears' kernels read.
ROW_FORMATS = frozenset((*quantized.GGML_FORMATS, *kquant.KQUANT_FORMATS))
#: dtypes the rows come back in.
ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

Lookup = Callable[[torch.Tensor], torch.Tensor | None]


def packed_rows(packed: PackedWeight, dtype: torch.dtype) -> Lookup | None:
    """``F.embedding(ids, packed.dequantize(dtype))`` for integer ids of any shape, without the dense table; None
    for a format or dtype it does not read (a :class:`~frame.weights.MixedRows` table, a plugin's own format)."""
    if packed.format not in ROW_FORMATS or dtype not in ROW_DTYPES:
        return None
    kernels.load()
    op = torch.ops.frame_cpu.packed_rows.default
    blocks, fmt = packed.tensors["blocks"], packed.format  # the file's mapped bytes, read in place
    if blocks.stride(-1) != 1:
        blocks = blocks.contiguous()

    def lookup(ids: torch.Tensor) -> torch.Tensor | None:
        if ids.dtype not in (torch.int64, torch.int32):
            return None
        return op(blocks, ids, fmt, dtype).view(*ids.shape, packed.in_features)

    return lookup
