"""GGMLWeight: a linear weight in one of ggml's block formats, as a GGUF file stores it.

The core's GGUF reader dequantises every tensor; a quantization plugin (``gguf``) hands these packed instead, and
a platform's kernels read the blocks in place. gguf's own dequantisation is the reference.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize

from frame.interfaces.quantization import PackedWeight

#: ggml's block types by frame's format name (``frame.interfaces.quantization.FORMATS``).
GGML_TYPES: dict[str, GGMLQuantizationType] = {
    "q4_0": GGMLQuantizationType.Q4_0,
    "q4_1": GGMLQuantizationType.Q4_1,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
    "iq4_nl": GGMLQuantizationType.IQ4_NL,
    "q2_k": GGMLQuantizationType.Q2_K,
    "q3_k": GGMLQuantizationType.Q3_K,
    "q4_k": GGMLQuantizationType.Q4_K,
    "q5_k": GGMLQuantizationType.Q5_K,
    "q6_k": GGMLQuantizationType.Q6_K,
    "iq4_xs": GGMLQuantizationType.IQ4_XS,
}


class GGMLWeight(PackedWeight):
    """A linear weight in one of ggml's block formats: ``tensors['blocks']`` uint8 ``[out, in / B * bytes]``,
    each row the blocks of one output feature exactly as the GGUF file stores them."""

    def __init__(self, format: str, blocks: torch.Tensor, in_features: int) -> None:
        super().__init__(format, {"blocks": blocks}, in_features)
        self.block_inputs, self.block_bytes = GGML_QUANT_SIZES[GGML_TYPES[format]]
        if blocks.dtype != torch.uint8 or blocks.shape[1] != in_features // self.block_inputs * self.block_bytes:
            raise ValueError(f"{format} blocks of shape {tuple(blocks.shape)} do not hold {in_features} inputs a row")

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """gguf's own dequantisation (numpy), the reference of every kernel of these formats."""
        dense = dequantize(self.tensors["blocks"].numpy(), GGML_TYPES[self.format])
        return torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)).to(dtype)

    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> GGMLWeight:
        return GGMLWeight(self.format, tensors["blocks"], in_features)

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        """Whole blocks of inputs (a tensor-parallel split that falls on block boundaries)."""
        size = self.block_inputs
        if start % size or length % size:
            raise ValueError(f"a {self.format} weight splits its inputs only at multiples of {size}, not at "
                             f"{start}:{start + length}")
        first, count = start // size * self.block_bytes, length // size * self.block_bytes
        return GGMLWeight(self.format, self.tensors["blocks"][:, first : first + count].contiguous(), length)

    @classmethod
    def quantized(cls, format: str, dense: torch.Tensor) -> GGMLWeight:
        """``dense`` ``[out, in]`` quantized by gguf's own quantizer (q4_0, q4_1, q5_0, q5_1, q8_0: the formats it
        writes)."""
        blocks = quantize(dense.float().numpy(), GGML_TYPES[format])
        return cls(format, torch.from_numpy(np.ascontiguousarray(blocks)), dense.shape[1])


class GGMLExperts:
    """A GGUF MoE tensor (``ffn_*_exps``): one :class:`GGMLWeight` per expert, ``blocks`` uint8 ``[E, out,
    in / B * bytes]`` the file's bytes (not copied). It indexes and measures like the dense ``[E, out, in]`` stack
    it stands for, so :func:`frame.weights.names.unstack_experts` hands each expert's matrix on packed."""

    def __init__(self, format: str, blocks: torch.Tensor, in_features: int) -> None:
        self.format, self.blocks, self.in_features = format, blocks, in_features

    @property
    def shape(self) -> torch.Size:
        """The dense stack's shape ``[E, out, in]``."""
        return torch.Size((self.blocks.shape[0], self.blocks.shape[1], self.in_features))

    def __getitem__(self, expert: int) -> GGMLWeight:
        return GGMLWeight(self.format, self.blocks[expert], self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense stack ``[E, out, in]`` in ``dtype``."""
        return torch.stack([self[e].dequantize(dtype) for e in range(self.blocks.shape[0])])
