"""GGUFWeights: a llama.cpp GGUF file's tensors, dequantised to float32 torch tensors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf.quants import dequantize

from frame.interfaces.model import WeightSource
from frame.weights.gguf_file import read_gguf
from frame.weights.progress import track_tensors

_UNQUANTISED = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


class GGUFWeights(WeightSource):
    """The tensors of one ``.gguf`` file with llama.cpp names (``blk.0.attn_q.weight``), as float32.

    GGUF lists dimensions fastest-first (``[in, out]`` for a linear weight); tensors come out in torch's order
    (``[out, in]``). Q and K projections keep llama.cpp's rotary row permutation: undoing it is the model
    family's job, because only it knows the head counts.
    """

    format: Literal["safetensors", "gguf"] = "gguf"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.reader = read_gguf(self.path)

    def __len__(self) -> int:
        return len(self.reader.tensors)

    @staticmethod
    def dense(tensor: ReaderTensor) -> torch.Tensor:
        """One of the reader's tensors as float32, shaped as torch expects (dequantised when it is quantized)."""
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if tensor.tensor_type in _UNQUANTISED and tensor.tensor_type != GGMLQuantizationType.BF16:
            array = np.array(tensor.data, dtype=np.float32)  # a copy: the reader's memmap is read-only
        else:
            array = dequantize(tensor.data, tensor.tensor_type)
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32).reshape(shape))

    def _read(self) -> Iterator[tuple[str, torch.Tensor]]:
        for tensor in self.reader.tensors:
            yield tensor.name, self.dense(tensor)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(llama_cpp_name, float32 tensor)`` in file order, shaped as torch expects."""
        yield from track_tensors(self._read(), len(self), f"Loading {self.path.name}")
