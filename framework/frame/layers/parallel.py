"""Tensor-parallel layers: each rank holds a slice of the weight and the layer does the communication.

A model family declares how its layers shard by choosing them: :class:`QKVParallelLinear` (query, key and value
heads, split by :class:`~frame.parallel.HeadPartition`), :class:`ColumnParallelLinear` and
:class:`SwiGLUProjection` (output features split, output left split), :class:`RowParallelLinear` (input features
split, partial products summed over the ranks), :class:`VocabParallelEmbedding` and :class:`ParallelLMHead`
(vocabulary split, gathered for the logits). Each reads the :class:`~frame.parallel.ParallelContext` current when
it is built; with one rank all of them are the plain computation. Checkpoint tensors arrive whole through
``load(kind, tensor, part)`` and each layer keeps its slice, so loading needs no family-specific sharding code.
The platform's kernels serve the local matmuls exactly as they serve :class:`~frame.layers.basic.Linear`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from frame.interfaces.quantization import PackedWeight
from frame.layers.basic import KernelLayer, Linear, SiluAndMul, copy_checked, empty_parameter
from frame.layers.quantized import note_dense_rows, store_rows, table_rows
from frame.parallel import HeadPartition, parallel_context


@dataclass(frozen=True)
class OutputPart:
    """A block of a column-parallel layer's output features: ``full`` rows in the checkpoint tensor named
    ``name``, of which this rank holds ``[start, start + size)``, placed at ``offset`` in its local weight."""

    name: str | None
    full: int
    start: int
    size: int
    offset: int = 0


def _layout(parts: list[OutputPart]) -> list[OutputPart]:
    """The parts, each placed after the previous one in the local weight."""
    placed, offset = [], 0
    for part in parts:
        placed.append(OutputPart(part.name, part.full, part.start, part.size, offset))
        offset += part.size
    return placed


class ColumnParallelLinear(Linear):
    """``y = x W^T + b`` with ``W``'s rows (output features) split over the ranks; ``y`` stays split.

    ``parts`` are the logical blocks of the output (one for a plain layer; Q, K and V, or gate and up, for fused
    ones); each is split on its own, so a fused layer's local output is ``[q_local | k_local | v_local]``.
    """

    def __init__(self, n_in: int, parts: list[OutputPart], bias: bool, device: torch.device, dtype: torch.dtype,
                 weight: nn.Parameter | None = None) -> None:
        self.parts = {p.name: p for p in _layout(parts)}
        super().__init__(n_in, sum(p.size for p in parts), bias, device, dtype, weight=weight)
        self.parallel = parallel_context()

    @classmethod
    def split_evenly(cls, n_in: int, n_out: int, bias: bool, device: torch.device, dtype: torch.dtype,
                     weight: nn.Parameter | None = None) -> ColumnParallelLinear:
        """One block of ``n_out`` features, split as evenly as the ranks allow."""
        return cls(n_in, [OutputPart(None, n_out, *parallel_context().split(n_out))], bias, device, dtype, weight)

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        """Keep this rank's rows of checkpoint tensor ``part`` (``kind``: ``weight`` or ``bias``)."""
        spec = self.parts.get(part)
        if spec is None:
            raise ValueError(f"this layer has no part {part!r}; it has {', '.join(map(str, self.parts))}")
        if tensor.shape[0] != spec.full:
            raise ValueError(f"a checkpoint {kind} of {tensor.shape[0]} rows does not fit {spec.full} ({part})")
        dest = getattr(self, kind)
        if dest is None:
            raise ValueError(f"the checkpoint has a {kind} that this layer does not have")
        rows = tensor.narrow(0, spec.start, spec.size)
        if isinstance(rows, PackedWeight):
            store_rows(dest, spec.offset, rows, kind)
            return
        copy_checked(dest.data[spec.offset : spec.offset + spec.size], rows, kind)
        note_dense_rows(dest, spec.offset, spec.size)

    def load_parts(self) -> list[str | None]:
        return list(self.parts)


class QKVParallelLinear(ColumnParallelLinear):
    """Query, key and value projections in one matmul, split by heads: each rank computes its query heads and
    the KV heads they read (a KV head is replicated on several ranks when there are fewer KV heads than ranks)."""

    def __init__(self, n_in: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 device: torch.device, dtype: torch.dtype) -> None:
        context = parallel_context()
        heads = HeadPartition.of(num_heads, num_kv_heads, context.world_size, context.rank)
        self.heads = heads
        super().__init__(n_in, [
            OutputPart("q", num_heads * head_dim, heads.q_start * head_dim, heads.q_count * head_dim),
            OutputPart("k", num_kv_heads * head_dim, heads.kv_start * head_dim, heads.kv_count * head_dim),
            OutputPart("v", num_kv_heads * head_dim, heads.kv_start * head_dim, heads.kv_count * head_dim),
        ], bias, device, dtype)


class RowParallelLinear(Linear):
    """``y = x W^T + b`` with ``W``'s columns (input features) split over the ranks: each rank multiplies its
    slice of ``x`` (a column-parallel layer's split output), the partial products are summed over the ranks, then
    the bias is added once. ``input_range`` is this rank's ``(start, size)`` of the ``n_in`` inputs (default: an
    even split)."""

    def __init__(self, n_in: int, n_out: int, bias: bool, device: torch.device, dtype: torch.dtype,
                 input_range: tuple[int, int] | None = None) -> None:
        self.parallel = parallel_context()
        self.full_in = n_in
        self.input_start, local_in = input_range or self.parallel.split(n_in)
        # With several ranks the bias is added after the sum, so the local matmul (and a platform kernel for it)
        # runs without one.
        sums = self.parallel.is_parallel
        super().__init__(local_in, n_out, bias and not sums, device, dtype)
        self.summed_bias = empty_parameter(n_out, device=device, dtype=dtype) if bias and sums else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if not self.parallel.is_parallel:
            return y
        y = self.parallel.all_reduce(y)
        return y if self.summed_bias is None else y + self.summed_bias

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        if kind == "bias":
            copy_checked(self.bias if self.summed_bias is None else self.summed_bias, tensor, "bias")
            return
        if tensor.shape[-1] != self.full_in:
            raise ValueError(f"a checkpoint weight of {tensor.shape[-1]} inputs does not fit {self.full_in}")
        copy_checked(self.weight, tensor.narrow(-1, self.input_start, self.weight.shape[-1]), "weight")


class SwiGLUProjection(ColumnParallelLinear):
    """SwiGLU's input side in one layer: ``silu(gate) * up`` for ``[gate | up] = x W^T + b``, ``weight``
    ``[2 * intermediate, in]`` with the gate rows first (each rank: its slice of gate, then the same of up).

    One layer rather than a :class:`ColumnParallelLinear` and a :class:`SiluAndMul`, so that a platform can apply
    the activation in the matmul's epilogue and never write the ``2 * intermediate``-wide product to memory. The
    output, ``intermediate`` features split over the ranks, feeds a :class:`RowParallelLinear` (``down``) whose
    ``input_range`` is :attr:`output_range`.
    """

    def __init__(self, n_in: int, intermediate: int, bias: bool, device: torch.device, dtype: torch.dtype) -> None:
        start, size = parallel_context().split(intermediate)
        self.output_range = (start, size)
        super().__init__(n_in, [OutputPart("gate", intermediate, start, size), OutputPart("up", intermediate, start,
                                                                                          size)], bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            out = self.kernel(x)
            if out is not None:
                return out
        return self.dense_forward(x, self.weight)

    def dense_forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return SiluAndMul.reference(F.linear(x, weight, self.bias))


class VocabParallelEmbedding(KernelLayer):
    """Token embeddings with the vocabulary split over the ranks: each rank looks up the ids in its range, zeros
    the others, and the ranks' results are summed."""

    def __init__(self, vocab_size: int, hidden: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.parallel = parallel_context()
        self.vocab_size = vocab_size
        self.start, size = self.parallel.split(vocab_size)
        self.weight = empty_parameter(size, hidden, device=device, dtype=dtype)

    #: Looks rows up from a packed table (:func:`~frame.layers.quantized.table_rows`): loading may keep it packed.
    reads_packed_rows = True

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.parallel.is_parallel:
            return table_rows(self, input_ids)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = table_rows(self, local.masked_fill(outside, 0))
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.parallel.all_reduce(out)

    def load(self, kind: str, tensor: torch.Tensor, part: str | None = None) -> None:
        if tensor.shape[0] != self.vocab_size:
            raise ValueError(f"a checkpoint embedding of {tensor.shape[0]} rows does not fit {self.vocab_size}")
        copy_checked(self.weight, tensor.narrow(0, self.start, self.weight.shape[0]), "weight")

    def load_parts(self) -> list[str | None]:
        return [None]


class ParallelLMHead(ColumnParallelLinear):
    """The output projection, vocabulary split over the ranks; the logits are gathered whole on every rank.

    ``weight`` shares a :class:`VocabParallelEmbedding`'s slice for tied checkpoints (the same split)."""

    def __init__(self, hidden: int, vocab_size: int, device: torch.device, dtype: torch.dtype,
                 weight: nn.Parameter | None = None) -> None:
        context = parallel_context()
        super().__init__(hidden, [OutputPart(None, vocab_size, *context.split(vocab_size))], False, device, dtype,
                         weight=weight)
        self.sizes = context.sizes(vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = super().forward(x)
        return self.parallel.all_gather(local, self.sizes) if self.parallel.is_parallel else local


def local_heads(num_heads: int, num_kv_heads: int) -> HeadPartition:
    """The query and KV heads this rank computes, for a model family sizing its attention."""
    context = parallel_context()
    return HeadPartition.of(num_heads, num_kv_heads, context.world_size, context.rank)


__all__ = ["ColumnParallelLinear", "KernelLayer", "OutputPart", "ParallelLMHead", "QKVParallelLinear",
           "RowParallelLinear", "SwiGLUProjection", "VocabParallelEmbedding", "local_heads"]
