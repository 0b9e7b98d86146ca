"""PersistentBatch: the runner's own copy of every request it runs, one row each, in fixed-capacity arrays.

The runner applies each step plan's diff to it (rows added for new requests, block ids appended, rows parked at
preemption and restored at resumption, rows dropped when a request ends) and appends the tokens it samples, so
a step's inputs are gathered with a handful of vectorised operations instead of a loop over requests, and no
scheduler object is ever read. Host arrays are numpy; their capacity is fixed at start (``max_num_seqs`` rows,
``max_model_len`` tokens), which is also what lets a platform capture a step into a graph over fixed buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from frame.engine.wire.plan import NewRequest, RunningRequest
from frame.sampling_params import SamplingParams


@dataclass
class RequestState:
    """What a row holds that is not an array column: the parameters and the seeded generator (kept while the
    request is parked after a preemption), the logit bias as id and value arrays, and the first prompt position
    whose logprob is still to report (``prompt_logprobs``: a recomputed position is not reported twice)."""

    req_id: str
    params: SamplingParams
    eos_token_ids: frozenset[int]
    generator: torch.Generator | None
    num_prompt_tokens: int
    parked_tokens: np.ndarray | None = None
    next_prompt_logprob: int = 1
    bias_ids: np.ndarray | None = None
    bias_values: np.ndarray | None = None
    #: The tokens that end the request once ``min_tokens`` are out: its stop token ids, and its end-of-sequence
    #: ids unless it ignores them (what the core's stop rules apply; the sampler bans them before then).
    stop_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.stop_ids = frozenset(self.params.stop_token_ids).union(
            frozenset() if self.params.ignore_eos else self.eos_token_ids)
        if self.params.logit_bias:
            self.bias_ids = np.fromiter(self.params.logit_bias.keys(), dtype=np.int64)
            self.bias_values = np.fromiter(self.params.logit_bias.values(), dtype=np.float32)


class PersistentBatch:
    """Rows of request state. ``row_of[req_id]`` finds a request's row; freed rows are reused."""

    def __init__(self, max_rows: int, max_model_len: int, block_size: int, num_groups: int = 1) -> None:
        self.max_rows = max_rows
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_rows, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_rows, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(max_rows, dtype=np.int32)
        self.num_computed = np.zeros(max_rows, dtype=np.int32)
        # One block table per KV group (frame.interfaces.kv_groups); group 0's are ``block_table``/``num_blocks``.
        self.group_tables = np.zeros((num_groups, max_rows, self.max_blocks), dtype=np.int32)
        self.group_num_blocks = np.zeros((num_groups, max_rows), dtype=np.int32)
        self.block_table = self.group_tables[0]
        self.num_blocks = self.group_num_blocks[0]
        self.num_drafts = np.zeros(max_rows, dtype=np.int32)  # drafts written after the row's tokens this step
        # Sampling parameters, one entry per row (defaults are inert: greedy, no cut, no penalty).
        self.temperature = np.zeros(max_rows, dtype=np.float32)
        self.top_p = np.ones(max_rows, dtype=np.float32)
        self.top_k = np.zeros(max_rows, dtype=np.int64)  # 0: no top-k cut
        self.min_p = np.zeros(max_rows, dtype=np.float32)
        self.repetition_penalty = np.ones(max_rows, dtype=np.float32)
        self.presence_penalty = np.zeros(max_rows, dtype=np.float32)
        self.frequency_penalty = np.zeros(max_rows, dtype=np.float32)
        self.min_tokens = np.zeros(max_rows, dtype=np.int32)
        self.num_logprobs = np.full(max_rows, -1, dtype=np.int32)  # -1: no logprobs
        self.num_prompt_logprobs = np.full(max_rows, -1, dtype=np.int32)  # -1: no prompt logprobs
        self.has_logit_bias = np.zeros(max_rows, dtype=bool)
        # Rows the sampler answers with the argmax alone: greedy, no logprobs, logit bias, penalties or min_tokens.
        # Derived from the columns above when a request takes its row (_place); a write to those columns afterwards
        # must clear it.
        self.plain_greedy = np.zeros(max_rows, dtype=bool)
        self.states: dict[str, RequestState] = {}
        self.row_of: dict[str, int] = {}
        self.state_of_row: list[RequestState | None] = [None] * max_rows
        self._free_rows = list(range(max_rows - 1, -1, -1))  # pop() yields the lowest row

    # -- rows ---------------------------------------------------------------------------------------------
    def add(self, req: NewRequest, seed_generator: torch.Generator | None) -> int:
        """A new request: its tokens, blocks and sampling parameters in a free row."""
        if req.req_id in self.states:
            raise ValueError(f"request {req.req_id} is already in the batch")
        params = req.params
        tokens = [*req.prompt_token_ids, *req.output_token_ids]
        state = RequestState(req.req_id, params, frozenset(req.eos_token_ids), seed_generator,
                             len(req.prompt_token_ids))
        self.states[req.req_id] = state
        row = self._place(state, np.asarray(tokens, dtype=np.int32))
        self._set_blocks(row, [req.block_ids, *req.group_block_ids], replace=True)
        return row

    def _place(self, state: RequestState, tokens: np.ndarray) -> int:
        if not self._free_rows:
            raise RuntimeError(f"the batch holds {self.max_rows} requests already (max_num_seqs)")
        if len(tokens) > self.max_model_len:
            raise ValueError(f"request {state.req_id} has {len(tokens)} tokens, over max_model_len")
        row = self._free_rows.pop()
        self.row_of[state.req_id] = row
        self.state_of_row[row] = state
        self.token_ids[row, : len(tokens)] = tokens
        self.num_tokens[row] = len(tokens)
        self.num_drafts[row] = 0
        self.num_prompt_tokens[row] = state.num_prompt_tokens
        params = state.params
        self.temperature[row] = params.temperature
        self.top_p[row] = params.top_p
        self.top_k[row] = params.top_k or 0
        self.min_p[row] = params.min_p
        self.repetition_penalty[row] = params.repetition_penalty
        self.presence_penalty[row] = params.presence_penalty
        self.frequency_penalty[row] = params.frequency_penalty
        self.min_tokens[row] = params.min_tokens
        self.num_logprobs[row] = -1 if params.logprobs is None else params.logprobs
        self.num_prompt_logprobs[row] = -1 if params.prompt_logprobs is None else params.prompt_logprobs
        self.has_logit_bias[row] = state.bias_ids is not None
        self.plain_greedy[row] = bool(
            self.temperature[row] <= 0.0 and self.num_logprobs[row] < 0 and not self.has_logit_bias[row]
            and self.repetition_penalty[row] == 1.0 and self.presence_penalty[row] == 0.0
            and self.frequency_penalty[row] == 0.0 and self.min_tokens[row] <= 0)
        return row

    def update(self, req: RunningRequest) -> int:
        """Apply a running request's diff (a resumed one gets its row back first); returns its row."""
        row = self.row_of.get(req.req_id)
        if req.resumed or row is None:
            state = self.states.get(req.req_id)
            if state is None or state.parked_tokens is None:
                raise ValueError(f"the plan resumes request {req.req_id}, which the runner does not hold parked")
            row = self._place(state, state.parked_tokens)
            state.parked_tokens = None
            self._set_blocks(row, [req.new_block_ids, *req.new_group_block_ids], replace=True)
        elif req.new_block_ids or req.new_group_block_ids:
            self._set_blocks(row, [req.new_block_ids, *req.new_group_block_ids], replace=False)
        drafts = req.spec_token_ids
        self.num_drafts[row] = len(drafts)
        if drafts:  # after the real tokens, where the step reads its inputs; overwritten by what is kept
            end = int(self.num_tokens[row])
            self.token_ids[row, end : end + len(drafts)] = drafts
        return row

    def _set_blocks(self, row: int, tables: list[list[int]], replace: bool) -> None:
        """Set (``replace``) or extend each KV group's table of ``row``; one list per group."""
        if len(tables) != len(self.group_tables):
            raise ValueError(f"the plan gives {len(tables)} block tables, the model has {len(self.group_tables)} "
                             "KV groups")
        for g, block_ids in enumerate(tables):
            start = 0 if replace else int(self.group_num_blocks[g, row])
            end = start + len(block_ids)
            if end > self.max_blocks:
                raise ValueError(f"a block table of {end} blocks exceeds max_model_len")
            self.group_tables[g, row, start:end] = block_ids
            self.group_num_blocks[g, row] = end

    def park(self, req_id: str) -> None:
        """A preempted request: free its row, keep its tokens and generator for when it resumes."""
        row = self.row_of.pop(req_id, None)
        if row is None:
            return
        state = self.states[req_id]
        state.parked_tokens = self.token_ids[row, : self.num_tokens[row]].copy()
        self._release(row)

    def remove(self, req_id: str) -> None:
        """A request that ended: forget everything about it."""
        row = self.row_of.pop(req_id, None)
        self.states.pop(req_id, None)
        if row is not None:
            self._release(row)

    def _release(self, row: int) -> None:
        self.state_of_row[row] = None
        self.group_num_blocks[:, row] = 0
        self.num_tokens[row] = 0
        self._free_rows.append(row)

    # -- tokens -------------------------------------------------------------------------------------------
    def append_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Append one sampled token to each of ``rows``."""
        if len(rows) == 1:  # a lone stream: two scalar stores, not two fancy-indexed ones run cold every step
            row = int(rows[0])
            end = int(self.num_tokens[row])
            self.token_ids[row, end] = tokens[0]
            self.num_tokens[row] = end + 1
            return
        self.token_ids[rows, self.num_tokens[rows]] = tokens
        self.num_tokens[rows] += 1

    def next_input_ids(self, rows: np.ndarray) -> np.ndarray:
        """Each of ``rows``' token at its computed length: a decode's input."""
        if len(rows) == 1:  # scalar reads: fancy indexing runs cold once a step after the weights' stream
            row = int(rows[0])
            return np.asarray([self.token_ids[row, int(self.num_computed[row])]], dtype=np.int64)
        return self.token_ids[rows, self.num_computed[rows]]

    def tables_of(self, row: int) -> list[np.ndarray]:
        """``row``'s block table in each KV group, as long as the blocks it holds there."""
        return [self.group_tables[g, row, : self.group_num_blocks[g, row]] for g in range(len(self.group_tables))]

    def all_plain_greedy(self, rows: np.ndarray) -> bool:
        """Does the sampler answer every one of ``rows`` with the argmax alone (:attr:`plain_greedy`)?"""
        if len(rows) == 1:
            return bool(self.plain_greedy[int(rows[0])])
        return bool(self.plain_greedy[rows].all())

    def extend(self, row: int, tokens: list[int]) -> None:
        """Append several tokens to one row (the drafts a verification kept, then the target's token)."""
        end = int(self.num_tokens[row])
        self.token_ids[row, end : end + len(tokens)] = tokens
        self.num_tokens[row] = end + len(tokens)

    def output_token_ids(self, row: int) -> np.ndarray:
        return self.token_ids[row, self.num_prompt_tokens[row] : self.num_tokens[row]]

    def all_token_ids(self, row: int) -> np.ndarray:
        return self.token_ids[row, : self.num_tokens[row]]

    @property
    def num_requests(self) -> int:
        return len(self.row_of)
