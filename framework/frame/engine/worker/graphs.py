"""DecodeGraphs: the model's decode step captured once per batch-size bucket over fixed buffers, then replayed.

A platform that can record a step (CUDA graphs) answers :meth:`~frame.interfaces.platform.Platform.capture_graph`
with a replay function; an attention backend whose kernels take every per-step value from device tensors (never
from host lists) sets ``supports_graphs``. The runner then keeps fixed-capacity device buffers (ids, positions,
slot mapping, context lengths, block tables at full width; a model whose layers keep KV in several groups, such as
Gemma's windowed layers, has a slot mapping and block tables per group) and, for a pure decode step of ``n``
requests, copies the step's values into their first ``n`` rows, pads the rest of the bucket with a scratch block
that no request owns, and replays the bucket's graph. Launch overheads (hundreds of kernels per step) vanish; the
sampler still runs eagerly on the first ``n`` rows of logits, except where the platform has a greedy kernel
(:meth:`~frame.interfaces.platform.Platform.greedy_kernel`): the recorded step then ends with each row's argmax,
written into a fixed buffer, and a step whose rows are all plain greedy takes its tokens from there
(:meth:`DecodeGraphs.greedy_tokens`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from frame.interfaces.attention import AttentionBackend, AttentionMetadata, GroupedMetadata
from frame.interfaces.kv_layout import decode_metadata
from frame.interfaces.model import CausalLM
from frame.weights.progress import track_tensors

log = logging.getLogger("frame.graphs")

#: A recorded step: calling it replays the recording and returns its output tensor (the same tensor every time).
Replay = Callable[[], torch.Tensor]
#: A platform's recorder: runs ``fn`` once under capture and returns its replay, or None when it cannot.
Capture = Callable[[Callable[[], torch.Tensor]], Replay | None]
#: A platform's greedy kernel: writes each row's argmax of the logits into an int64 tensor.
Greedy = Callable[[torch.Tensor, torch.Tensor], None]


def capture_sizes(max_num_seqs: int, largest: int = 256) -> list[int]:
    """Batch-size buckets: 1, 2, 4, 8, then every 16 up to ``max_num_seqs`` (and at most ``largest``)."""
    top = min(max_num_seqs, largest)
    sizes = [s for s in (1, 2, 4, 8) if s <= top] + list(range(16, top + 1, 16))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


class DecodeGraphs:
    """Fixed buffers and one recorded decode step per bucket; ``scratch_block`` is a block outside the pool (in
    every KV group's layers)."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 device: torch.device, *, max_num_seqs: int, max_model_len: int, block_size: int, scratch_block: int,
                 capture: Capture, greedy: Greedy | None = None, group_of_layer: list[int] | None = None) -> None:
        """``greedy``: the platform's greedy kernel, run at the end of every recorded step (None: none).
        ``group_of_layer``: each cache layer's KV group where the model has several (``GroupedMetadata``)."""
        self.model, self.attention, self.kv_caches, self.device = model, attention, kv_caches, device
        self.block_size, self.scratch_block, self.max_model_len = block_size, scratch_block, max_model_len
        self.group_of_layer = group_of_layer if group_of_layer and max(group_of_layer) > 0 else None
        num_groups = max(self.group_of_layer) + 1 if self.group_of_layer else 1
        self.sizes = capture_sizes(max_num_seqs)
        rows, width = self.sizes[-1], -(-max_model_len // block_size)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        # Per KV group: the slot each row writes and the rows' block tables.
        self.slot_mappings = [torch.zeros(rows, dtype=torch.int64, device=device) for _ in range(num_groups)]
        self.block_tables = [torch.full((rows, width), scratch_block, dtype=torch.int32, device=device)
                             for _ in range(num_groups)]
        self.query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.greedy = greedy
        self.greedy_ids = torch.zeros(rows, dtype=torch.int64, device=device)  # the last replay's argmax per row
        # On the host the buffers are filled through numpy views of them: one assignment each, where a torch copy
        # is a slice, a conversion and a copy, every one of which runs cold once a step after the linears have
        # streamed the weights through the caches (SmolLM2's single stream: run() outside its replay took 52 us a
        # token that way, 13 this way).
        self._host = None if self.device.type != "cpu" else (
            self.input_ids.numpy(), self.positions.numpy(), self.seq_lens.numpy(),
            [t.numpy() for t in self.slot_mappings], [t.numpy() for t in self.block_tables])
        self._host_greedy = self.greedy_ids.numpy() if self.device.type == "cpu" else None
        self._pad(0, rows)
        self._last_positions: list[int] | None = None  # the rows' positions in the last replay
        self.replays: dict[int, Replay] = {}
        self._buckets: list[int | None] = []  # per number of decodes, its bucket (once every size is recorded)
        for size in reversed(self.sizes):  # largest first, as CUDA graph memory pools prefer
            replay = capture(self._step_fn(size))
            if replay is None:
                log.info("the platform records no graphs here; decode steps run eagerly")
                self.replays.clear()
                return
            self.replays[size] = replay
        self._buckets = [next((size for size in self.sizes if size >= n), None) for n in range(self.sizes[-1] + 1)]

    def record_all(self) -> None:
        """Replay every bucket once over the padded buffers (each row decodes into the scratch block): a platform
        that records a bucket on its first replay (cpu) records them all now, so that no request pays for one."""
        for size in track_tensors(self.sizes, len(self.sizes), "recording decode graphs"):
            self.replays[size]()

    @property
    def enabled(self) -> bool:
        return bool(self.replays)

    def bucket(self, num_seqs: int) -> int | None:
        """The smallest recorded batch size that holds ``num_seqs`` decodes (None: too many, run eagerly)."""
        return self._buckets[num_seqs] if num_seqs < len(self._buckets) else None

    def _step_fn(self, size: int) -> Callable[[], torch.Tensor]:
        metas = [self.attention.build_metadata(decode_metadata(self.query_start_loc, self.seq_lens, tables, slots,
                                                               size, self.max_model_len, self.block_size))
                 for slots, tables in zip(self.slot_mappings, self.block_tables, strict=True)]
        meta: AttentionMetadata | GroupedMetadata = (
            metas[0] if self.group_of_layer is None else GroupedMetadata(metas, self.group_of_layer))
        ids, positions = self.input_ids[:size], self.positions[:size]
        model, kv_caches, greedy, greedy_ids = self.model, self.kv_caches, self.greedy, self.greedy_ids[:size]

        # Not `self`: the recorded step would hold this object through its own replays dict, a cycle that
        # gc.collect() was seen not to free, so every engine dropped in a process kept its weights and KV pool.
        def step() -> torch.Tensor:
            logits = model.compute_logits(model(ids, positions, kv_caches, meta))
            if greedy is not None:
                greedy(logits, greedy_ids)
            return logits

        return step

    def _pad(self, start: int, stop: int) -> None:
        """Rows ``[start, stop)`` decode one token into the scratch block, reading only it."""
        self.input_ids[start:stop] = 0
        self.positions[start:stop] = 0
        self.seq_lens[start:stop] = 1
        for slots, tables in zip(self.slot_mappings, self.block_tables, strict=True):
            slots[start:stop] = self.scratch_block * self.block_size
            tables[start:stop] = self.scratch_block

    def follows(self, positions: list[int]) -> bool:
        """Are ``positions`` each of the last replay's rows one further on (what :meth:`advance` would give)?"""
        last = self._last_positions
        return last is not None and len(last) == len(positions) and all(
            p == q + 1 for p, q in zip(positions, last, strict=True))

    def set_tables(self, index: int, tables: list[np.ndarray]) -> None:
        """Rewrite row ``index``'s block table in each KV group (one array each) before an :meth:`advance`."""
        if self._host is not None:
            for view, table in zip(self._host[4], tables, strict=True):
                view[index, : len(table)] = table
            return
        for buffer, table in zip(self.block_tables, tables, strict=True):
            buffer[index, : len(table)].copy_(torch.from_numpy(table), non_blocking=True)

    def advance(self, input_ids: np.ndarray) -> torch.Tensor:
        """Replay the bucket :meth:`run` replayed last with each of its rows one position further on and
        ``input_ids`` its next tokens: the next of continuous decode steps, whose block tables :meth:`run` was
        given already. Only the positions, sequence lengths and slots move, in the buffers themselves."""
        n, bs = len(input_ids), self.block_size
        size = self.bucket(n)
        assert size is not None, f"no recorded graph holds {n} decodes"
        if self._host is not None and n == 1:  # a lone stream: scalar stores, each numpy call on it runs cold
            ids, pos, lens, host_slots, host_tables = self._host
            ids[0] = input_ids[0]
            position = int(pos[0]) + 1
            pos[0], lens[0] = position, position + 1
            for slot, tables in zip(host_slots, host_tables, strict=True):
                slot[0] = int(tables[0, position // bs]) * bs + position % bs
        elif self._host is not None:
            ids, pos, lens, host_slots, host_tables = self._host
            ids[:n] = input_ids
            pos[:n] += 1
            lens[:n] += 1
            for slot, tables in zip(host_slots, host_tables, strict=True):
                slot[:n] = tables[np.arange(n), pos[:n] // bs].astype(np.int64) * bs + pos[:n] % bs
        else:
            self.input_ids[:n].copy_(torch.from_numpy(input_ids.astype(np.int64)), non_blocking=True)
            self.positions[:n] += 1
            self.seq_lens[:n] += 1
            positions = self.positions[:n]
            for slots, tables in zip(self.slot_mappings, self.block_tables, strict=True):
                blocks = tables[:n].gather(1, (positions // bs).unsqueeze(1)).squeeze(1)
                slots[:n] = blocks.to(torch.int64) * bs + positions % bs
        if self._last_positions is not None:
            self._last_positions = [p + 1 for p in self._last_positions]
        logits = self.replays[size]()
        return logits if n == size else logits[:n]

    def run(self, input_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, seq_lens: np.ndarray,
            block_tables: np.ndarray, group_slots: tuple[np.ndarray, ...] = (),
            group_tables: tuple[np.ndarray, ...] = ()) -> torch.Tensor:
        """Replay the bucket of ``n = len(input_ids)`` decodes and return their logits ``[n, vocab]``;
        ``group_slots`` and ``group_tables``: the KV groups' after the first (``HostInputs``')."""
        n = len(input_ids)
        size = self.bucket(n)
        assert size is not None, f"no recorded graph holds {n} decodes"
        all_slots, all_tables = (slots, *group_slots), (block_tables, *group_tables)
        assert len(all_slots) == len(self.slot_mappings), "one slot mapping and block table per KV group"
        if self._host is not None:
            ids, pos, lens, host_slots, host_tables = self._host
            ids[:n], pos[:n], lens[:n] = input_ids, positions, seq_lens
            for slot, tables, new_slots, new_tables in zip(host_slots, host_tables, all_slots, all_tables,
                                                           strict=True):
                slot[:n], tables[:n, :new_tables.shape[1]] = new_slots, new_tables
        else:
            self.input_ids[:n].copy_(torch.from_numpy(input_ids.astype(np.int64)), non_blocking=True)
            self.positions[:n].copy_(torch.from_numpy(positions), non_blocking=True)
            self.seq_lens[:n].copy_(torch.from_numpy(seq_lens.astype(np.int32)), non_blocking=True)
            for slot, tables, new_slots, new_tables in zip(self.slot_mappings, self.block_tables, all_slots,
                                                           all_tables, strict=True):
                slot[:n].copy_(torch.from_numpy(new_slots), non_blocking=True)
                tables[:n, :new_tables.shape[1]].copy_(torch.from_numpy(new_tables), non_blocking=True)
        if n < size:  # rows past n may hold an earlier step's values
            self._pad(n, size)
        self._last_positions = positions.tolist()
        logits = self.replays[size]()
        return logits if n == size else logits[:n]

    def greedy_tokens(self, n: int) -> np.ndarray | None:
        """Each of the first ``n`` rows' argmax of the logits the last :meth:`run` or :meth:`advance` returned (a
        copy), or None without a greedy kernel."""
        if self.greedy is None:
            return None
        if self._host_greedy is not None:
            return self._host_greedy[:n].copy()
        return np.array(self.greedy_ids[:n].cpu())  # a copy: the next replay rewrites the buffer
