"""ModelRunner: owns the tensors. Builds one flat batch per step, runs the model, samples.

It allocates the KV pool in the core's layout (per layer, K and V ``[num_blocks, block_size, num_kv_heads,
head_dim]``, all in one tensor), performs the block copies a cache strategy orders, turns a SchedulerOutput into
input ids, positions, slot mapping and block tables, and returns one StepResult per sequence that samples.
"""

from __future__ import annotations

import torch

from frame.engine.sampler import Sampler
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.cache import BlockCopy, KVCacheStrategy
from frame.interfaces.model import CausalLM
from frame.interfaces.scheduler import SchedulerOutput, StepResult


class ModelRunner:
    """Runs a loaded model over a paged KV pool."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 block_size: int, seed: int = 0) -> None:
        self.model = model
        self.attention = attention
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.sampler = Sampler(seed)
        self.kv: torch.Tensor | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def bytes_per_block(self) -> int:
        return self.model.kv_cache_spec.bytes_per_block(self.block_size, self.dtype)

    def allocate_kv(self, num_blocks: int) -> None:
        """Allocate the pool: one tensor ``[layers, 2, num_blocks, block_size, kv_heads, head_dim]``."""
        spec = self.model.kv_cache_spec
        # empty, not zeros: every slot is written before it is read, and zeroing gigabytes costs seconds.
        self.kv = torch.empty(
            (spec.num_layers, 2, num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim),
            dtype=self.dtype, device=self.device,
        )
        self.kv_caches = [(self.kv[i, 0], self.kv[i, 1]) for i in range(spec.num_layers)]

    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        """Copy slots ``[0, n)`` of each source block into its destination, in every layer."""
        assert self.kv is not None
        for c in copies:
            self.kv[:, :, c.dst, : c.num_tokens] = self.kv[:, :, c.src, : c.num_tokens]

    def prepare(self, out: SchedulerOutput, cache: KVCacheStrategy) -> tuple[torch.Tensor, torch.Tensor,
                                                                            AttentionMetadata, list[int]]:
        """Input ids, positions, attention metadata and the batch rows whose logits are sampled."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        bs = self.block_size
        for item in out.scheduled:
            seq, start, n = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            table = list(cache.block_table(seq.seq_id))
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            query_lens.append(n)
            seq_lens.append(start + n)
            tables.append(table)
            if item.samples:
                sample_rows.append(len(input_ids) - 1)
        width = max(len(t) for t in tables)
        block_tables = torch.zeros((len(tables), width), dtype=torch.int32)
        for i, t in enumerate(tables):
            block_tables[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        dev = self.device
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=block_tables.to(dev),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_lens=query_lens,
            seq_lens_host=seq_lens,
            block_size=bs,
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos, meta, sample_rows

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, cache: KVCacheStrategy) -> dict[str, StepResult]:
        """Run one step; returns the sampled token (and logprobs) of every sequence that samples."""
        if out.copies:
            self.copy_blocks(out.copies)
        ids, pos, meta, sample_rows = self.prepare(out, cache)
        self.attention.prepare(meta)
        hidden = self.model(ids, pos, self.kv_caches, meta)
        sampling = [item.seq for item in out.scheduled if item.samples]
        if not sampling:
            return {}
        logits = self.model.compute_logits(hidden[sample_rows])
        results = self.sampler(logits, sampling)
        return {seq.seq_id: r for seq, r in zip(sampling, results, strict=True)}
