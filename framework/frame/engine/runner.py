"""ModelRunner: owns the tensors of one model worker. Applies a step plan, runs the model, samples.

It allocates the KV pool in the core's layout (per layer, K and V ``[num_blocks, block_size, num_kv_heads,
head_dim]``, all in one tensor), keeps a :class:`~frame.engine.batch.PersistentBatch` that it updates from each
plan's diff, performs the block copies the plan orders, gathers the step's inputs (ids, positions, slot mapping,
block tables) with vectorised operations over that batch, and answers with a
:class:`~frame.engine.plan.RunnerOutput`. It never sees a scheduler, a cache strategy or a ``Sequence``.
"""

from __future__ import annotations

import numpy as np
import torch

from frame.engine.batch import PersistentBatch
from frame.engine.plan import BlockCopy, RequestSample, RunnerOutput, SchedulerOutput
from frame.engine.sampler import Sampler
from frame.interfaces.attention import AttentionBackend, AttentionMetadata
from frame.interfaces.model import CausalLM


class StepInputs:
    """One step's flat batch: the model's inputs, the common attention metadata, and who samples."""

    def __init__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                 logits_rows: torch.Tensor, sampling_rows: np.ndarray, sampling_ids: list[str]) -> None:
        self.input_ids = input_ids
        self.positions = positions
        self.meta = meta
        self.logits_rows = logits_rows
        self.sampling_rows = sampling_rows
        self.sampling_ids = sampling_ids


class ModelRunner:
    """Runs a loaded model over a paged KV pool, from step plans."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 block_size: int, max_num_seqs: int, max_model_len: int, seed: int = 0) -> None:
        self.model = model
        self.attention = attention
        self.device = device
        self.dtype = dtype
        self.block_size = block_size
        self.batch = PersistentBatch(max_num_seqs, max_model_len, block_size)
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

    # -- the plan -----------------------------------------------------------------------------------------
    def apply_plan(self, plan: SchedulerOutput) -> tuple[np.ndarray, np.ndarray]:
        """Update the persistent batch from ``plan``; returns the scheduled rows and their new-token counts."""
        batch = self.batch
        for req_id in plan.finished_ids:
            batch.remove(req_id)
        for req_id in plan.preempted_ids:
            batch.park(req_id)
        rows = [batch.add(r, self._generator(r.params.seed)) for r in plan.new_requests]
        rows += [batch.update(r) for r in plan.running]
        counts = [r.num_new_tokens for r in plan.new_requests] + [r.num_new_tokens for r in plan.running]
        computed = [r.num_computed_tokens for r in plan.new_requests] + [r.num_computed_tokens for r in plan.running]
        row_array = np.asarray(rows, dtype=np.int64)
        batch.num_computed[row_array] = computed
        return row_array, np.asarray(counts, dtype=np.int64)

    @staticmethod
    def _generator(seed: int | None) -> torch.Generator | None:
        return None if seed is None else torch.Generator().manual_seed(seed)

    def prepare(self, rows: np.ndarray, counts: np.ndarray) -> StepInputs:
        """Gather the flat batch of the scheduled ``rows`` (``counts`` new tokens each), in that order."""
        batch, bs = self.batch, self.block_size
        ends = np.cumsum(counts)
        starts = ends - counts
        total = int(ends[-1])
        context = batch.num_computed[rows].astype(np.int64)
        owner = np.repeat(np.arange(len(rows)), counts)  # batch position of each token
        positions = context[owner] + (np.arange(total) - starts[owner])
        token_rows = rows[owner]
        input_ids = batch.token_ids[token_rows, positions]
        slots = batch.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = context + counts
        width = int(batch.num_blocks[rows].max())
        samples = seq_lens == batch.num_tokens[rows]
        dev = self.device
        meta = AttentionMetadata(
            query_start_loc=torch.from_numpy(np.concatenate(([0], ends)).astype(np.int32)).to(dev),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(dev),
            block_tables=torch.from_numpy(np.ascontiguousarray(batch.block_table[rows, :width])).to(dev),
            slot_mapping=torch.from_numpy(slots).to(dev),
            query_lens=counts.tolist(),
            seq_lens_host=seq_lens.tolist(),
            block_size=bs,
        )
        sampling_rows = rows[samples]
        states = batch.state_of_row
        return StepInputs(
            input_ids=torch.from_numpy(input_ids.astype(np.int64)).to(dev),
            positions=torch.from_numpy(positions).to(dev),
            meta=meta,
            logits_rows=torch.from_numpy(ends[samples] - 1).to(dev),
            sampling_rows=sampling_rows,
            sampling_ids=[states[r].req_id for r in sampling_rows.tolist()],  # type: ignore[union-attr]
        )

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        """Run one step; returns the sampled token (and logprobs) of every request that reached its end."""
        rows, counts = self.apply_plan(plan)
        if plan.block_copies:
            self.copy_blocks(plan.block_copies)
        if not len(rows):
            return RunnerOutput()
        inputs = self.prepare(rows, counts)
        meta = self.attention.build_metadata(inputs.meta)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, meta)
        if not len(inputs.sampling_rows):
            return RunnerOutput()
        logits = self.model.compute_logits(hidden[inputs.logits_rows])
        sampled = self.sampler(logits, self.batch, inputs.sampling_rows)
        self.batch.append_tokens(inputs.sampling_rows, sampled.token_ids)
        tokens = sampled.token_ids.tolist()
        samples = [
            RequestSample(req_id, [token], None if lp is None else [lp])
            for req_id, token, lp in zip(inputs.sampling_ids, tokens, sampled.logprobs, strict=True)
        ]
        return RunnerOutput(samples=samples)
