"""The launch plan of one step: how the flat batch's queries are cut into tiles for the attention kernel.

The kernel's grid is ``(num_tiles, num_kv_heads)``. A tile is up to ``block_q`` consecutive query tokens of
one sequence; its rows are those tokens times the ``group`` query heads that share one KV head (padded to a
power of two), so a decode with grouped-query attention still fills the rows of a matrix multiply. The plan
is built once per step from the host copies of the query lengths, so no device sync is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

#: tl.dot needs at least 16 rows.
MIN_BLOCK_M = 16


@dataclass(frozen=True)
class TilePlan:
    """Tiles of one step: tile ``i`` covers queries ``[tile_q0[i], tile_q0[i] + block_q)`` of ``tile_seq[i]``."""

    block_q: int
    group_padded: int
    tile_seq: torch.Tensor
    tile_q0: torch.Tensor

    @property
    def block_m(self) -> int:
        """Rows of one tile: query tokens times padded heads per KV head."""
        return self.block_q * self.group_padded

    @property
    def num_tiles(self) -> int:
        return int(self.tile_seq.shape[0])


def choose_block_q(group: int, max_query_len: int, prefill_block_m: int) -> int:
    """Query tokens per tile: ``prefill_block_m`` rows when prefilling, fewer for short queries, never < 16 rows."""
    group_padded = triton.next_power_of_2(group)
    rows = MIN_BLOCK_M if max_query_len <= 1 else max(prefill_block_m, MIN_BLOCK_M)
    fewest = max(1, MIN_BLOCK_M // group_padded)
    wanted = min(max(1, rows // group_padded), triton.next_power_of_2(max(max_query_len, 1)))
    return max(fewest, wanted)


def build_plan(query_lens: list[int], group: int, prefill_block_m: int, device: torch.device) -> TilePlan:
    """Cut every sequence's queries into tiles; sequences without queries get none."""
    if any(q < 0 for q in query_lens):
        raise ValueError(f"query lengths must not be negative: {query_lens}")
    block_q = choose_block_q(group, max(query_lens, default=0), prefill_block_m)
    seqs: list[int] = []
    starts: list[int] = []
    for seq, q_len in enumerate(query_lens):
        for q0 in range(0, q_len, block_q):
            seqs.append(seq)
            starts.append(q0)
    return TilePlan(
        block_q=block_q,
        group_padded=triton.next_power_of_2(group),
        tile_seq=torch.tensor(seqs, dtype=torch.int32).to(device, non_blocking=True),
        tile_q0=torch.tensor(starts, dtype=torch.int32).to(device, non_blocking=True),
    )
