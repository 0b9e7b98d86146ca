"""ModelRunner: owns the tensors of one model worker. Applies a step plan, runs the model, samples.

It allocates the KV pool in the core's layout (per layer, K and V ``[num_blocks, block_size, num_kv_heads,
head_dim]``, all in one tensor), keeps a :class:`~frame.engine.worker.batch.PersistentBatch` that it updates from each
plan's diff, performs the block copies the plan orders, gathers the step's inputs (ids, positions, slot mapping,
block tables) with vectorised operations over that batch, runs the model (or replays a recorded decode graph,
:mod:`frame.engine.worker.graphs`), samples, and answers with a :class:`~frame.engine.wire.plan.RunnerOutput`. It
never sees a scheduler, a cache strategy or a ``Sequence``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from frame.engine.wire.plan import BlockCopy, PromptLogprobs, RequestSample, RunnerOutput, SchedulerOutput
from frame.engine.worker.batch import PersistentBatch
from frame.engine.worker.graphs import Capture, DecodeGraphs, Greedy
from frame.engine.worker.prompt_logprobs import PromptRows, score_prompt, take_prompt_rows
from frame.engine.worker.sampler import Sampler, mask_disallowed
from frame.engine.worker.speculation import verify
from frame.interfaces.attention import AttentionBackend, AttentionMetadata, GroupedMetadata
from frame.interfaces.grammar import from_bytes
from frame.interfaces.kv_groups import KVGroups
from frame.interfaces.kv_layout import KVPool, step_metadata
from frame.interfaces.model import CausalLM
from frame.interfaces.proposer import ProposalRequest, Proposer


@dataclass
class HostInputs:
    """One step's flat batch on the host (numpy), gathered from the persistent batch."""

    input_ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    query_lens: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    samples: np.ndarray  # per scheduled request: does this step reach its last token (drafts included)?
    drafts: np.ndarray  # per scheduled request: draft tokens verified in this step
    prompt: np.ndarray  # per scheduled request: are its new tokens prompt tokens (AttentionMetadata.prompt)?
    # The slots and block tables of the KV groups after the first (``slots``/``block_tables`` are group 0's).
    group_slots: tuple[np.ndarray, ...] = ()
    group_tables: tuple[np.ndarray, ...] = ()

    @property
    def is_pure_decode(self) -> bool:
        """One sampled token per request: a prompt's last token alone (after a prefix-cache hit) is no decode."""
        return bool((self.query_lens == 1).all() and self.samples.all() and not self.prompt.any())

    def logits_rows(self) -> np.ndarray:
        """Flat-batch rows whose logits are sampled: each sampling request's last ``drafts + 1`` tokens."""
        ends = np.cumsum(self.query_lens)[self.samples]
        spans = self.drafts[self.samples] + 1
        offsets = np.arange(int(spans.sum())) - np.repeat(np.cumsum(spans) - spans, spans)
        return np.repeat(ends - spans, spans) + offsets


class StepInputs:
    """One step's flat batch: the model's inputs, the common attention metadata, and who samples."""

    def __init__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                 logits_rows: torch.Tensor, group_metas: tuple[AttentionMetadata, ...] = ()) -> None:
        self.input_ids = input_ids
        self.positions = positions
        self.meta = meta
        self.logits_rows = logits_rows
        self.group_metas = group_metas  # the common metadata of the KV groups after the first


class ModelRunner:
    """Runs a loaded model over a paged KV pool, from step plans."""

    def __init__(self, model: CausalLM, attention: AttentionBackend, device: torch.device, dtype: torch.dtype,
                 block_size: int, max_num_seqs: int, max_model_len: int, seed: int = 0,
                 kv_dtype: torch.dtype | None = None, kv_groups: KVGroups | None = None) -> None:
        """``kv_dtype`` is the pool's (``--kv-cache-dtype``; None: ``dtype``); ``kv_groups`` the model's KV groups
        (None: one group of every layer), each with its own block table per request."""
        self.model = model
        self.attention = attention
        self.device = device
        self.dtype = dtype
        self.kv_dtype = kv_dtype or dtype
        self.block_size = block_size
        self.kv_groups = kv_groups or KVGroups.single(model.kv_cache_spec.num_layers)
        self.batch = PersistentBatch(max_num_seqs, max_model_len, block_size, self.kv_groups.num_groups)
        self.sampler = Sampler(seed)
        self.pool: KVPool | None = None
        self.graphs: DecodeGraphs | None = None
        self._replayed = 0  # rows of the last forward when it was a graph's replay (0: it ran eagerly)
        self._replayed_rows: np.ndarray | None = None  # the batch rows of that replay, in its order
        self.proposer: Proposer | None = None
        self.draft_batch_limit: int | None = None  # no drafts when more requests than this decode in a step
        self._draft_probs: dict[str, torch.Tensor] = {}

    @property
    def bytes_per_block(self) -> int:
        spec = self.model.kv_cache_spec  # a block holds one KV group's layers
        return dataclasses.replace(spec, num_layers=self.kv_groups.group_size).bytes_per_block(self.block_size,
                                                                                              self.kv_dtype)

    def allocate_kv(self, num_blocks: int, scratch_block: bool = False) -> None:
        """Allocate the pool (:class:`~frame.interfaces.kv_layout.KVPool`), plus one block past the end that no
        request owns when ``scratch_block`` (padding rows of recorded graphs use it)."""
        self.pool = KVPool(self.model.kv_cache_spec, num_blocks, self.block_size, self.kv_dtype, self.device,
                           scratch_blocks=int(scratch_block), groups=self.kv_groups)

    @property
    def kv(self) -> torch.Tensor | None:
        """The pool's one tensor ``[layers, 2, blocks, block_size, kv_heads, width]`` (None before
        :meth:`allocate_kv`)."""
        return self.pool.tensor if self.pool is not None else None

    @property
    def kv_caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self.pool.caches if self.pool is not None else []

    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        """Copy slots ``[0, n)`` of each source block into its destination, in every layer."""
        assert self.pool is not None
        for c in copies:
            self.pool.copy_block(c.src, c.dst, c.num_tokens)

    # -- the plan -----------------------------------------------------------------------------------------
    def apply_plan(self, plan: SchedulerOutput) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Update the persistent batch from ``plan``; returns the scheduled rows, their new-token counts and
        whether each samples (the scheduler's decision, carried by the plan)."""
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
        if len(rows) == 1:  # a lone stream: a scalar store, not a fancy-indexed one run cold every step
            batch.num_computed[rows[0]] = computed[0]
        else:
            batch.num_computed[row_array] = computed
        samples = [r.samples for r in plan.new_requests] + [r.samples for r in plan.running]
        return row_array, np.asarray(counts, dtype=np.int64), np.asarray(samples, dtype=bool)

    @staticmethod
    def _generator(seed: int | None) -> torch.Generator | None:
        return None if seed is None else torch.Generator().manual_seed(seed)

    def gather(self, rows: np.ndarray, counts: np.ndarray, samples: np.ndarray) -> HostInputs:
        """The flat batch of the scheduled ``rows`` (``counts`` new tokens each, in that order; ``samples``: which
        reach their last token), on the host."""
        batch, bs = self.batch, self.block_size
        ends = np.cumsum(counts)
        context = batch.num_computed[rows].astype(np.int64)
        if int(ends[-1]) == len(rows):
            # One new token a row (decodes): each row's token is at its context length. The general path's half
            # dozen numpy calls each run cold once a step (after the weights' stream) for the same arrays.
            positions, token_rows = context, rows
        else:
            starts = ends - counts
            owner = np.repeat(np.arange(len(rows)), counts)  # batch position of each token
            positions = context[owner] + (np.arange(int(ends[-1])) - starts[owner])
            token_rows = rows[owner]
        seq_lens = context + counts
        width = int(batch.num_blocks[rows].max())
        drafts = batch.num_drafts[rows].astype(np.int64)
        group_slots, group_tables = [], []
        for g in range(1, self.kv_groups.num_groups):
            table = batch.group_tables[g]
            group_slots.append(table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs)
            group_tables.append(np.ascontiguousarray(table[rows, :int(batch.group_num_blocks[g, rows].max())]))
        return HostInputs(
            input_ids=batch.token_ids[token_rows, positions],
            positions=positions,
            slots=batch.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs,
            query_lens=counts,
            seq_lens=seq_lens,
            block_tables=np.ascontiguousarray(batch.block_table[rows, :width]),
            samples=samples,
            drafts=drafts,
            prompt=context < batch.num_prompt_tokens[rows],
            group_slots=tuple(group_slots),
            group_tables=tuple(group_tables),
        )

    def to_device(self, host: HostInputs) -> StepInputs:
        """The model's inputs and the common attention metadata on the model's device."""
        dev = self.device
        meta = step_metadata(host.query_lens, host.seq_lens, host.block_tables, host.slots, self.block_size, dev,
                             host.prompt)
        return StepInputs(
            input_ids=torch.from_numpy(host.input_ids.astype(np.int64)).to(dev),
            positions=torch.from_numpy(host.positions).to(dev),
            meta=meta,
            logits_rows=torch.from_numpy(host.logits_rows()).to(dev),
            group_metas=tuple(step_metadata(host.query_lens, host.seq_lens, tables, slots, self.block_size, dev,
                                            host.prompt)
                              for slots, tables in zip(host.group_slots, host.group_tables, strict=True)),
        )

    def capture_graphs(self, capture: Capture, max_num_seqs: int, greedy: Greedy | None = None) -> bool:
        """Record the decode step per batch-size bucket (the pool must have a scratch block past its end), each
        ending with the platform's ``greedy`` kernel where it has one."""
        assert self.pool is not None and self.pool.scratch_blocks == 1, "allocate_kv(..., scratch_block=True) first"
        self.graphs = DecodeGraphs(self.model, self.attention, self.kv_caches, self.device,
                                   max_num_seqs=max_num_seqs, max_model_len=self.batch.max_model_len,
                                   block_size=self.block_size, scratch_block=self.pool.first_scratch_block,
                                   capture=capture, greedy=greedy, group_of_layer=self.kv_groups.group_of_layer)
        if not self.graphs.enabled:
            self.graphs = None
        self._replayed_rows = None
        return self.graphs is not None

    def forward(self, host: HostInputs, prompt: PromptRows | None = None,
                ) -> tuple[torch.Tensor | None, list[PromptLogprobs]]:
        """Logits ``[sampling requests, vocab]`` of one step (None when no request samples) and the prompt
        logprobs of ``prompt``'s rows, from the same forward: a recorded graph for a decode step that fits one,
        the model run eagerly otherwise."""
        if (prompt is None and self.graphs is not None and host.is_pure_decode
                and self.graphs.bucket(len(host.query_lens))):
            self._replayed = len(host.query_lens)
            return self.graphs.run(host.input_ids, host.positions, host.slots, host.seq_lens, host.block_tables,
                                   host.group_slots, host.group_tables), []
        self._replayed = 0
        inputs = self.to_device(host)
        meta: AttentionMetadata | GroupedMetadata = self.attention.build_metadata(inputs.meta)
        if inputs.group_metas:
            meta = GroupedMetadata([meta, *map(self.attention.build_metadata, inputs.group_metas)],  # type: ignore[list-item]
                                   self.kv_groups.group_of_layer)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, meta)
        scored = score_prompt(self.model, hidden, prompt) if prompt is not None else []
        return (self.model.compute_logits(hidden[inputs.logits_rows]) if host.samples.any() else None), scored

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        """Run one step; returns the sampled tokens (and logprobs) of every request that reached its end, the
        prompt logprobs of the prompt positions it computed for requests that ask, and the proposer's drafts for
        the next step. Runs in inference mode: the loops that step the engine enter it once, not once a step
        (its context manager and decorator ran about 30 us a lone stream's token, cold after the weights' stream)."""
        if torch.is_inference_mode_enabled():
            return self._execute(plan)
        with torch.inference_mode():
            return self._execute(plan)

    def _execute(self, plan: SchedulerOutput) -> RunnerOutput:
        rows, counts, sampling = self.apply_plan(plan)
        if plan.block_copies:
            self.copy_blocks(plan.block_copies)
        if self.proposer is not None:
            self._forget_drafts(plan)
        if not len(rows):
            return RunnerOutput()
        if self._continues_replay(plan, rows):
            assert self.graphs is not None
            for i, r in enumerate(plan.running):
                if r.new_block_ids or any(r.new_group_block_ids):
                    self.graphs.set_tables(i, self.batch.tables_of(int(rows[i])))
            logits, scored = self.graphs.advance(self.batch.next_input_ids(rows)), []
            samples = self._sample_plain(logits, rows, self._replayed_greedy_tokens())
        else:
            host = self.gather(rows, counts, sampling)
            logits, scored = self.forward(host, take_prompt_rows(self.batch, rows, counts, host.seq_lens - counts))
            self._replayed_rows = rows if self._replayed else None
            if logits is None:
                return RunnerOutput(prompt_logprobs=scored)
            if plan.grammar_ids:
                self.apply_grammar(logits, plan, rows[host.samples], host.drafts[host.samples])
            greedy = None if plan.grammar_ids else self._replayed_greedy_tokens()
            samples = self.sample(logits, rows[host.samples], host.drafts[host.samples], greedy)
        if plan.decode_steps > 1:
            samples = self.continue_decoding(samples, rows, counts, sampling, plan.decode_steps - 1)
        if self.proposer is not None:
            samples = self.propose(samples)
        return RunnerOutput(samples=samples, prompt_logprobs=scored)

    def _continues_replay(self, plan: SchedulerOutput, rows: np.ndarray) -> bool:
        """Is this step the last replay's rows, in order, each a token on, no request or constraint changed? Then
        the buffers only move on (:meth:`DecodeGraphs.advance`; new blocks' tables rewritten): a lone stream's general
        gather and checks ran about 0.1 ms a token, cold after the weights' stream."""
        last = self._replayed_rows
        if (last is None or self.graphs is None or self.proposer is not None or len(rows) != len(last)
                or not plan.only_moves_decodes_on):
            return False
        # Lists, not numpy: on a handful of rows each numpy call costs more than the comparison.
        return rows.tolist() == last.tolist() and self.graphs.follows(self.batch.num_computed[rows].tolist())

    def continue_decoding(self, samples: list[RequestSample], rows: np.ndarray, counts: np.ndarray,
                          sampling: np.ndarray, more: int) -> list[RequestSample]:
        """Run up to ``more`` further decode steps of ``rows`` (the scheduler's continuous decode steps, each
        row's last sampled token its next input, in KV slots the plan's tables already hold); returns each
        request's tokens of them all. Stops early once every row sampled an end token: the scheduler would drop
        what follows. After a replayed step the next one only moves the graph's inputs on
        (:meth:`DecodeGraphs.advance`): none of the general gathering and checks, each of which runs cold once a
        token after the weights have streamed through the caches."""
        batch = self.batch
        tokens = [list(s.token_ids) for s in samples]
        logprobs = [None if s.logprobs is None else list(s.logprobs) for s in samples]
        ends = [batch.state_of_row[row].stop_ids for row in rows.tolist()]  # type: ignore[union-attr]
        last = np.asarray([t[-1] for t in tokens])
        for _ in range(more):
            if all(t[-1] in end for t, end in zip(tokens, ends, strict=True)):
                break
            batch.num_computed[rows] += 1
            if self.graphs is not None and self._replayed == len(rows):
                logits = self.graphs.advance(last)
            else:
                logits, _ = self.forward(self.gather(rows, counts, sampling))
                assert logits is not None
            sampled = self.sampler(logits, batch, rows, self._replayed_greedy_tokens())
            batch.append_tokens(rows, sampled.token_ids)
            last = sampled.token_ids
            for i, token in enumerate(last.tolist()):
                tokens[i].append(token)
                if logprobs[i] is not None:
                    logprobs[i].append(sampled.logprobs[i])  # type: ignore[union-attr, arg-type]
        return [RequestSample(s.req_id, t, lp) for s, t, lp in zip(samples, tokens, logprobs, strict=True)]

    def _replayed_greedy_tokens(self) -> np.ndarray | None:
        """Each row's argmax that the last forward's recorded step wrote (None: it ran eagerly, or the platform has
        no greedy kernel); the caller leaves it out where the logits were changed after the step (a grammar)."""
        if not self._replayed or self.graphs is None:
            return None
        return self.graphs.greedy_tokens(self._replayed)

    def apply_grammar(self, logits: torch.Tensor, plan: SchedulerOutput, rows: np.ndarray, drafts: np.ndarray) -> None:
        """Mask the logits of constrained requests with the plan's structured-output rows (every position each
        samples: its last token and its drafts), so nothing outside the grammar can be sampled or kept."""
        states = self.batch.state_of_row
        first = np.cumsum(drafts + 1) - (drafts + 1)
        start_of = {states[row].req_id: int(f) for row, f in zip(rows.tolist(), first, strict=True)}  # type: ignore[union-attr]
        index: list[int] = []
        for req_id in plan.grammar_ids:
            row = self.batch.row_of[req_id]
            index.extend(range(start_of[req_id], start_of[req_id] + int(self.batch.num_drafts[row]) + 1))
        mask_disallowed(logits, index, from_bytes(plan.grammar_bitmask, logits.shape[-1]))

    def sample(self, logits: torch.Tensor, rows: np.ndarray, drafts: np.ndarray,
               greedy: np.ndarray | None = None) -> list[RequestSample]:
        """Sample (requests without drafts, vectorised) or verify (requests with drafts) and append the tokens.
        ``greedy``: each row's argmax of ``logits``, when the recorded step computed it."""
        states = self.batch.state_of_row
        if not drafts.any():
            return self._sample_plain(logits, rows, greedy)
        spans = drafts + 1
        ends = np.cumsum(spans)
        plain = drafts == 0
        out: dict[int, RequestSample] = {}
        if plain.any():
            index = torch.from_numpy(ends[plain] - 1).to(logits.device)
            for sample in self.sample(logits[index], rows[plain], drafts[plain]):
                out[self.batch.row_of[sample.req_id]] = sample
        spec_rows = rows[~plain].tolist()
        index = np.concatenate([np.arange(e - s, e) for e, s in zip(ends[~plain], spans[~plain], strict=True)])
        proposed = [self.batch.token_ids[row, self.batch.num_tokens[row]:][: self.batch.num_drafts[row]].tolist()
                    for row in spec_rows]
        probs = [self._draft_probs.pop(states[row].req_id, None) for row in spec_rows]  # type: ignore[union-attr]
        probs = [None if p is None else p[: len(d)] for p, d in zip(probs, proposed, strict=True)]
        verified = verify(logits[torch.from_numpy(index).to(logits.device)], self.batch, spec_rows, proposed, probs,
                          self.sampler.generator)
        for row, result in zip(spec_rows, verified, strict=True):
            self.batch.extend(row, result.token_ids)
            out[row] = RequestSample(states[row].req_id, result.token_ids, result.logprobs)  # type: ignore[union-attr]
        return [out[row] for row in rows.tolist()]

    def _sample_plain(self, logits: torch.Tensor, rows: np.ndarray, greedy: np.ndarray | None) -> list[RequestSample]:
        """Sample one token for each of ``rows`` (no drafts) and append it."""
        states = self.batch.state_of_row
        sampled = self.sampler(logits, self.batch, rows, greedy)
        self.batch.append_tokens(rows, sampled.token_ids)
        return [RequestSample(states[row].req_id, [token], None if lp is None else [lp])  # type: ignore[union-attr]
                for row, token, lp in zip(rows.tolist(), sampled.token_ids.tolist(), sampled.logprobs, strict=True)]

    def propose(self, samples: list[RequestSample]) -> list[RequestSample]:
        """Ask the proposer for the next step's drafts of every request that just sampled."""
        assert self.proposer is not None
        if self.draft_batch_limit is not None and len(samples) > self.draft_batch_limit:
            return samples
        batch = self.batch
        requests = []
        for sample in samples:
            row = batch.row_of[sample.req_id]
            room = batch.max_model_len - int(batch.num_tokens[row]) - 1
            requests.append(ProposalRequest(sample.req_id, batch.all_token_ids(row),
                                            max(0, min(self.proposer.num_speculative_tokens, room))))
        proposals = self.proposer.propose(requests)
        out = []
        for sample, proposal in zip(samples, proposals, strict=True):
            if proposal.probs is not None and proposal.token_ids:
                self._draft_probs[sample.req_id] = proposal.probs
            out.append(RequestSample(sample.req_id, sample.token_ids, sample.logprobs, list(proposal.token_ids)))
        return out

    def _forget_drafts(self, plan: SchedulerOutput) -> None:
        assert self.proposer is not None
        for req_id in (*plan.finished_ids, *plan.preempted_ids):
            self._draft_probs.pop(req_id, None)
            self.proposer.forget(req_id)
