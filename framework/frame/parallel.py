"""Tensor parallelism's shared state: this worker's rank, its group, and how heads and rows are split.

The model worker sets the :class:`ParallelContext` once (:func:`set_parallel_context`) before the model family
builds its network; the parallel layers of :mod:`frame.layers` read it to size their shards and to reduce or
gather their outputs, so a model family holds no communication code. With one rank every collective is a no-op.

Splits need not be even: a dimension of ``n`` units over ``w`` ranks gives the first ``n % w`` ranks one unit
more, so SmolLM2's 3 KV heads (9 query heads) run on 2 ranks as 2 + 1 KV heads (6 + 3 query heads). When there
are fewer KV heads than ranks, each KV head is replicated on ``world / kv_heads`` ranks, which split its query
heads among them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


def split_range(total: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, size)`` of part ``index`` when ``total`` units are split over ``parts``, larger parts first."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, base + (1 if index < extra else 0)


@dataclass(frozen=True)
class HeadPartition:
    """The query and KV heads one rank owns (global indices ``[start, start + count)``)."""

    q_start: int
    q_count: int
    kv_start: int
    kv_count: int

    @classmethod
    def of(cls, num_heads: int, num_kv_heads: int, world_size: int, rank: int) -> HeadPartition:
        """This rank's heads; ValueError (naming the fix) for head counts that cannot be split this way."""
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
        group = num_heads // num_kv_heads
        if world_size <= num_kv_heads:
            kv_start, kv_count = split_range(num_kv_heads, world_size, rank)
            return cls(kv_start * group, kv_count * group, kv_start, kv_count)
        if world_size % num_kv_heads or group % (world_size // num_kv_heads):
            raise ValueError(
                f"tensor_parallel_size {world_size} cannot split {num_heads} query heads over {num_kv_heads} KV "
                f"heads; use a size that divides {num_kv_heads}, or a multiple of it that divides {num_heads}"
            )
        replicas = world_size // num_kv_heads
        q_count = group // replicas
        return cls(rank * q_count, q_count, rank // replicas, 1)


class Communicator:
    """Collectives over one torch.distributed process group, timed (``seconds`` accumulates until read)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.seconds = 0.0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        start = time.perf_counter()
        dist.all_reduce(tensor, group=self.group)
        self.seconds += time.perf_counter() - start
        return tensor

    def all_gather(self, tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along its last dimension; rank ``r`` holds ``sizes[r]`` columns."""
        start = time.perf_counter()
        widest = max(sizes)
        local = tensor
        if tensor.shape[-1] < widest:  # all_gather needs equal shapes: pad, then trim each part
            local = torch.nn.functional.pad(tensor, (0, widest - tensor.shape[-1]))
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in sizes]
        dist.all_gather(parts, local, group=self.group)
        out = torch.cat([part[..., :size] for part, size in zip(parts, sizes, strict=True)], dim=-1)
        self.seconds += time.perf_counter() - start
        return out

    def take_seconds(self) -> float:
        """Seconds spent in collectives since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds


@dataclass(frozen=True)
class ParallelContext:
    """This worker's place in tensor parallelism; ``communicator`` is None with one rank."""

    rank: int = 0
    world_size: int = 1
    communicator: Communicator | None = field(default=None, compare=False)

    @property
    def is_parallel(self) -> bool:
        return self.world_size > 1

    def split(self, total: int) -> tuple[int, int]:
        """``(start, size)`` of this rank's part of a dimension of ``total`` units."""
        return split_range(total, self.world_size, self.rank)

    def sizes(self, total: int) -> list[int]:
        """Every rank's part size of a dimension of ``total`` units."""
        return [split_range(total, self.world_size, r)[1] for r in range(self.world_size)]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.communicator is None else self.communicator.all_reduce(tensor)

    def all_gather(self, tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        return tensor if self.communicator is None else self.communicator.all_gather(tensor, sizes)


_current = ParallelContext()


def parallel_context() -> ParallelContext:
    """The context of this process's model worker (one rank, no group, unless a worker set another)."""
    return _current


def set_parallel_context(context: ParallelContext) -> None:
    """Set by the model worker before the model is built; tests reset it to ``ParallelContext()``."""
    global _current
    _current = context
