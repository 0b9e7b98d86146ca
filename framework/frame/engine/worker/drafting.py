"""DraftModel: a second (smaller) model beside the target, with a paged KV pool of its own, for draft proposers.

Built by :attr:`frame.interfaces.proposer.ProposerContext.load_draft_model` on the worker's platform, dtype and
attention backend, through the same model-family plugins as the target. A proposer feeds it each request's new
tokens (:meth:`extend`) and reads the logits of each request's last position; :meth:`rewind` forgets KV past the
tokens the target kept, :meth:`drop` forgets a request. Blocks come from a free list sized at creation; a request
that finds none is simply not drafted for (:meth:`reserve` says so).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from frame.interfaces.kv_layout import KVPool, sequence_metadata
from frame.layers import attach_platform_kernels
from frame.model_source import ModelSource
from frame.plugins.hooks import PluginHooks
from frame.weights import open_weights


class DraftModel:
    """A loaded model and its KV pool; requests are keyed by id. Single-threaded, like the worker."""

    def __init__(self, model: str | None, hooks: PluginHooks, selection: object, max_model_len: int, block_size: int,
                 num_blocks: int, max_num_seqs: int) -> None:
        # The engine's own resolution of a family and of its per-layer attention (windows, soft-caps, scales).
        from frame.engine.selection import select_model_family
        from frame.engine.worker.attention_layers import create_layer_attention, family_specs

        sel = selection
        self.source = ModelSource.open(model)  # None: the bundled default model
        hf = self.source.hf_config
        self.vocab_size = int(hf.vocab_size)
        self.device, self.dtype = sel.platform.device, sel.dtype  # type: ignore[attr-defined]
        family = select_model_family(hooks, self.source.architecture)
        layers = create_layer_attention(
            hooks, sel.attn, family_specs(hooks, family, hf, None), world_size=1, rank=0,  # type: ignore[attr-defined]
            dtype=self.dtype, platform=sel.platform, options=sel.options["attention"],  # type: ignore[attr-defined]
        )
        self.attention = layers[0]  # builds each forward's metadata, for every layer
        self.model = hooks.create_model(family, hf, self.dtype, self.device, self.attention, layers)
        self.model.load_weights(open_weights(self.source.path))
        self.model.eval()
        attach_platform_kernels(self.model, sel.platform)  # type: ignore[attr-defined]
        spec = self.model.kv_cache_spec
        self.block_size, self.max_model_len = block_size, max_model_len
        self.pool = KVPool(spec, num_blocks, block_size, self.dtype, self.device)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}
        self._computed: dict[str, int] = {}

    # -- bookkeeping --------------------------------------------------------------------------------------
    def num_computed(self, req_id: str) -> int:
        """Tokens of ``req_id`` whose KV the draft holds."""
        return self._computed.get(req_id, 0)

    def reserve(self, req_id: str, num_tokens: int) -> bool:
        """Make room for ``req_id`` to hold ``num_tokens`` tokens; False (nothing changed) if the pool is short."""
        table = self._tables.setdefault(req_id, [])
        missing = -(-num_tokens // self.block_size) - len(table)
        if missing > len(self._free):
            if not table:
                del self._tables[req_id]
            return False
        table.extend(self._free.pop() for _ in range(max(missing, 0)))
        return True

    def rewind(self, req_id: str, num_tokens: int) -> None:
        """Forget KV past the first ``num_tokens`` tokens of ``req_id`` (drafts the target did not keep)."""
        if req_id in self._computed:
            self._computed[req_id] = min(self._computed[req_id], num_tokens)

    def reset(self, num_blocks: int | None = None) -> None:
        """Forget every request; with ``num_blocks``, hand out only that many blocks from now on (tests reuse one
        loaded draft model under several pool sizes this way)."""
        self._tables.clear()
        self._computed.clear()
        total = self.pool.num_blocks if num_blocks is None else min(num_blocks, self.pool.num_blocks)
        self._free = list(range(total - 1, -1, -1))

    def drop(self, req_id: str) -> None:
        """Forget ``req_id`` entirely; its blocks go back to the pool."""
        self._free.extend(self._tables.pop(req_id, []))
        self._computed.pop(req_id, None)

    # -- compute ------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def extend(self, items: Sequence[tuple[str, Sequence[int]]]) -> torch.Tensor:
        """Compute the KV of each item's new tokens after what its request holds, in one forward; returns the
        float32 logits of each item's last new token ``[len(items), vocab]``. Call :meth:`reserve` first."""
        ids, positions, contexts, query_lens, tables = [], [], [], [], []
        for req_id, tokens in items:
            start = self.num_computed(req_id)
            ids.append(np.asarray(tokens, dtype=np.int64))
            positions.append(np.arange(start, start + len(tokens)))
            contexts.append(start)
            query_lens.append(len(tokens))
            tables.append(self._tables[req_id])
            self._computed[req_id] = start + len(tokens)
        dev = self.device
        meta = self.attention.build_metadata(sequence_metadata(contexts, query_lens, tables, self.block_size, dev))
        hidden = self.model(torch.from_numpy(np.concatenate(ids)).to(dev),
                            torch.from_numpy(np.concatenate(positions)).to(dev), self.pool.caches, meta)
        ends = np.cumsum(query_lens)
        return self.model.compute_logits(hidden[torch.from_numpy(ends - 1).to(dev)]).float()
