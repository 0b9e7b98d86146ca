"""ReorderedRows: a packed weight's rows in another order, copied only while something reads them.

llama.cpp's converter interleaves the rows of each Q and K head of Llama and Mistral for its rotary layout, and the
Llama family puts them back in Hugging Face order. A copy in that order would stay resident beside the kernel's
own repacked copy for as long as the engine runs (45 MiB for a Llama 3.2 1B's Q and K in q4_K), for a reference
path that runs only where no kernel serves an input. This weight keeps the file's rows (a view of its memory map)
and the order: :attr:`tensors` makes the reordered copy each time it is read (a kernel being built, the
reference's dequantisation), and :meth:`file_views` names the file's pages a kernel gives back once it holds its
own copy.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from frame.interfaces.quantization import PackedWeight


class ReorderedRows(PackedWeight):
    """Rows ``order`` of ``source`` (``order[i]`` is the source row that row ``i`` reads), made on demand."""

    def __init__(self, source: PackedWeight, order: torch.Tensor) -> None:
        # Not PackedWeight.__init__: it would store tensors, which here are made on every read.
        if isinstance(source, ReorderedRows):
            source, order = source.source, source.order[order]
        self.source, self.order = source, order
        self.format, self.in_features = source.format, source.in_features
        self.block_inputs = source.block_inputs

    @property
    def tensors(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The source's tensors with their rows in this order: a new copy at each read."""
        return {k: t[self.order].contiguous() for k, t in self.source.tensors.items()}

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.order.numel(), self.in_features))

    @property
    def nbytes(self) -> int:
        return self.source.nbytes * self.order.numel() // self.source.shape[0]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.source.dequantize(dtype)[self.order]

    def with_tensors(self, tensors: dict[str, torch.Tensor], in_features: int) -> PackedWeight:
        return self.source.with_tensors(tensors, in_features)

    def rows(self, index: slice | torch.Tensor) -> PackedWeight:
        return ReorderedRows(self.source, self.order[index])

    def narrow_inputs(self, start: int, length: int) -> PackedWeight:
        return ReorderedRows(self.source.narrow_inputs(start, length), self.order)

    def resolved(self) -> PackedWeight:
        return self.source.with_tensors(self.tensors, self.in_features)

    def file_views(self) -> Iterable[torch.Tensor]:
        return self.source.file_views()
