"""PackedGGUFWeights: a GGUF file whose quantized matrices stay packed as :class:`frame.weights.GGMLWeight`."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from frame.interfaces.quantization import PackedWeight
from frame.weights import GGMLExperts, GGMLWeight, GGUFWeights
from frame.weights.ggml import GGML_TYPES
from frame.weights.progress import track_tensors

#: The ggml block formats kept packed (``frame.interfaces.quantization.FORMATS``).
KEPT_FORMATS: tuple[str, ...] = tuple(GGML_TYPES)
_FORMAT_OF = {qtype: name for name, qtype in GGML_TYPES.items()}
_DENSE_TYPES = ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")
_LAYER = re.compile(r"^blk\.\d+\.")
log = logging.getLogger(__name__)


def tensor_summary(names: list[str]) -> str:
    """Tensor names, those of several layers folded: ``blk.*.ffn_down.weight (24), output.weight``."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(_LAYER.sub("blk.*.", name), []).append(name)
    return ", ".join(f"{pattern} ({len(group)})" if len(group) > 1 else group[0] for pattern, group in groups.items())


def mapped(array: np.ndarray) -> torch.Tensor:
    """The reader's read-only memory map of a tensor's bytes as a uint8 tensor, without a copy: the blocks stay the
    file's pages (resident only while read, given back to the page cache under pressure). Nothing writes packed
    blocks in place; every row or input selection copies."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array.view(np.uint8))


class PackedGGUFWeights(GGUFWeights):
    """A GGUF file's tensors with llama.cpp names: matrices in a ``keep`` format as :class:`GGMLWeight` and MoE
    expert stacks as :class:`GGMLExperts` (the file's bytes in its memory map, not copied), every other tensor
    dequantised to float32 as the core reads it."""

    def __init__(self, path: str | Path, keep: frozenset[str] = frozenset(KEPT_FORMATS)) -> None:
        super().__init__(path)
        self.keep = keep

    def log_dense_quantized(self) -> None:
        """One line per quantized type whose tensors arrive dense (no packed format for it, a format left out of
        ``keep``, or a quantized vector), naming the type and the tensors: never a silent dequantisation."""
        by_type: dict[str, list[str]] = {}
        for tensor in self.reader.tensors:
            kind = tensor.tensor_type.name
            fmt = _FORMAT_OF.get(tensor.tensor_type)
            if kind not in _DENSE_TYPES and not (fmt in self.keep and len(tensor.shape) in (2, 3)):
                by_type.setdefault(kind.lower(), []).append(tensor.name)
        for kind, names in by_type.items():
            why = ("not a matrix or a stack of experts' matrices, or left out of --quantization-opt keep"
                   if kind in KEPT_FORMATS else
                   "frame keeps no packed format of this type")
            log.warning("%s: %d %s tensor%s dequantized to float32 at load (%s): %s", self.path.name, len(names), kind,
                        "s" if len(names) > 1 else "", why, tensor_summary(names))

    def _packed_or_dense(self) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
        self.log_dense_quantized()
        for tensor in self.reader.tensors:
            fmt = _FORMAT_OF.get(tensor.tensor_type)
            if fmt in self.keep and len(tensor.shape) in (2, 3):
                in_features = int(tensor.shape[0])  # GGUF lists dimensions fastest first
                blocks = mapped(tensor.data)
                if len(tensor.shape) == 2:
                    yield tensor.name, GGMLWeight(fmt, blocks.reshape(int(tensor.shape[1]), -1), in_features)
                else:  # an MoE stack [E, out, in]: each expert's matrix stays packed
                    shape = (int(tensor.shape[2]), int(tensor.shape[1]), -1)
                    yield tensor.name, GGMLExperts(fmt, blocks.reshape(shape), in_features)
            else:
                yield tensor.name, self.dense(tensor)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:  # type: ignore[override]
        """Yield ``(llama_cpp_name, tensor or GGMLWeight)`` in file order, shaped ``[out, in]``."""
        yield from track_tensors(self._packed_or_dense(), len(self), f"Loading {self.path.name} (packed)")
