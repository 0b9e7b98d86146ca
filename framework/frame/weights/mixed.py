"""MixedRows: one linear weight whose blocks of output rows come packed in different formats.

llama.cpp's presets choose a type per tensor (a Q4_K_M file stores some layers' V projection in q6_K beside their q4_K
Q and K), and frame fuses Q, K and V (and gate and up) into one layer. The parts then stay packed, each in its own
format, one after another; a platform runs each part's kernel and joins the outputs, and the reference is the
parts' dequantised rows stacked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from frame.interfaces.quantization import PackedWeight


class MixedRows(PackedWeight):
    """Packed ``parts`` stacked along the output rows, each in its own format (``format`` ``"mixed"``).

    ``tensors`` holds only an empty ``[out, 0]`` placeholder (the row count); the blocks are the parts'.
    """

    def __init__(self, parts: Sequence[PackedWeight]) -> None:
        inputs = {p.in_features for p in parts}
        if len(inputs) != 1:
            raise ValueError(f"the parts of a weight disagree on its inputs: {sorted(inputs)}")
        self.parts = [q for p in parts for q in (p.parts if isinstance(p, MixedRows) else [p])]
        rows = sum(p.shape[0] for p in self.parts)
        super().__init__("mixed", {"rows": torch.empty(rows, 0, dtype=torch.uint8)}, inputs.pop())

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def offsets(self) -> list[int]:
        """The first output row of each part, and the total."""
        starts = [0]
        for part in self.parts:
            starts.append(starts[-1] + part.shape[0])
        return starts

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])

    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
        raise ValueError("a mixed-format weight has no tensors of its own; select its rows or inputs instead")

    def rows(self, index: slice | torch.Tensor) -> PackedWeight:
        """A contiguous run of rows (each part cut to it); rows in another order cannot stay mixed."""
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise ValueError("a mixed-format weight selects its rows only as one contiguous slice")
        start, stop, _ = index.indices(self.shape[0])
        cut = []
        for part, first in zip(self.parts, self.offsets, strict=False):
            lo, hi = max(start, first) - first, min(stop, first + part.shape[0]) - first
            if lo < hi:
                cut.append(part.rows(slice(lo, hi)))
        if not cut:
            raise ValueError(f"rows {start}:{stop} select nothing of a weight of {self.shape[0]} rows")
        return cut[0] if len(cut) == 1 else MixedRows(cut)

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        return MixedRows([p.narrow_inputs(start, length) for p in self.parts])

    def file_views(self) -> Iterable[torch.Tensor]:
        return [t for p in self.parts for t in p.file_views()]
