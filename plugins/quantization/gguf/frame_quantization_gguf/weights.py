"""PackedGGUFWeights: a GGUF file whose quantized matrices stay packed as :class:`frame.weights.GGMLWeight`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights import GGMLWeight, GGUFWeights
from frame.weights.ggml import GGML_TYPES
from frame.weights.progress import track_tensors

#: The ggml block formats kept packed (``frame.interfaces.quantization.FORMATS``).
KEPT_FORMATS: tuple[str, ...] = tuple(GGML_TYPES)
_FORMAT_OF = {qtype: name for name, qtype in GGML_TYPES.items()}


class PackedGGUFWeights(GGUFWeights):
    """A GGUF file's tensors with llama.cpp names: matrices in a ``keep`` format as :class:`GGMLWeight` (the
    file's bytes, copied out of its memory map), every other tensor dequantised to float32 as the core reads it."""

    def __init__(self, path: str | Path, keep: frozenset[str] = frozenset(KEPT_FORMATS)) -> None:
        super().__init__(path)
        self.keep = keep

    def _packed_or_dense(self) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
        for tensor in self.reader.tensors:
            fmt = _FORMAT_OF.get(tensor.tensor_type)
            if fmt in self.keep and len(tensor.shape) == 2:
                in_features = int(tensor.shape[0])  # GGUF lists dimensions fastest first
                blocks = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))
                yield tensor.name, GGMLWeight(fmt, blocks.reshape(int(tensor.shape[1]), -1), in_features)
            else:
                yield tensor.name, self.dense(tensor)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:  # type: ignore[override]
        """Yield ``(llama_cpp_name, tensor or GGMLWeight)`` in file order, shaped ``[out, in]``."""
        yield from track_tensors(self._packed_or_dense(), len(self), f"Loading {self.path.name} (packed)")
