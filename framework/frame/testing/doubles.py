"""Test doubles for the conformance suites: small, obviously correct stand-ins for real plugins.

:class:`PagedAllocatorDouble` is a KV-cache strategy that pages but never reuses anything. It lets the scheduler
suite run without any cache plugin installed, and isolates scheduler bugs from cache bugs.
:class:`SimulatedModel` stands in for the model runner: it checks the KV bookkeeping of every step and samples a
deterministic token, with no tensors. Both are test doubles: never use them for serving.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from frame.engine.wire.plan import RequestSample, RunnerOutput, SchedulerOutput
from frame.interfaces.cache import CacheSequence, KVCacheStrategy, PrefixMatch


class PagedAllocatorDouble(KVCacheStrategy):
    """TEST DOUBLE: a paged allocator with no prefix reuse (every match is empty, nothing stays cached).

    Free blocks are handed out lowest id first; freeing returns them to the free list at once. Its
    :meth:`publish` checks that a sequence never claims more computed tokens than its table holds.
    """

    reuses_prefixes = False
    eviction_policy = "none"

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() yields the lowest id

    def lookup(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int]:
        return [self._free.pop() for _ in range(count)]

    def publish(self, seq: CacheSequence, table: list[int], state: Any, num_tokens: int) -> Any:
        if self.num_blocks_needed(seq.num_computed_tokens) > len(table):
            raise AssertionError(
                f"{seq.seq_id} committed {seq.num_computed_tokens} tokens but holds only {len(table)} blocks"
            )
        return state

    def release(self, seq: CacheSequence, table: list[int], state: Any, num_computed: int) -> None:
        self._free.extend(reversed(table))

    def clear(self) -> None:
        """Nothing is ever cached."""


_MODULUS = (1 << 61) - 1
_BASE = 1_000_003


def prefix_fingerprints(token_ids: Seq[int], extra_keys: tuple[str, ...] = ()) -> list[int]:
    """One number per position that stands for that position's KV: it depends on every token up to it and on
    the extra keys (cache salt), as real KV does. A polynomial rolling hash; only tests compare these."""
    value = zlib.crc32("\x1f".join(extra_keys).encode()) if extra_keys else 0
    out = []
    for token in token_ids:
        value = (value * _BASE + token + 1) % _MODULUS
        out.append(value)
    return out


@dataclass
class _SimRequest:
    """The simulated runner's copy of one request: its tokens, its block table and its progress."""

    tokens: list[int]
    table: list[int]
    computed: int
    extra_keys: tuple[str, ...]
    parked: bool = False


class SimulatedModel:
    """TEST DOUBLE of the model runner and model: keeps its own copy of every request from the step plans alone
    (as the real runner does), checks the KV bookkeeping, then "samples" a fixed token.

    :meth:`execute` applies the plan's diff (new requests, appended blocks, parked and resumed ones, ended ones),
    performs the block copies on a simulated slot store, checks that every already computed position of each
    scheduled request finds its own KV in the slot its block table names (so a cache that hands out a wrong or
    evicted block, a scheduler that loses track of progress, or a plan that leaves something out fails loudly),
    writes the KV of the new tokens, and samples for each request whose step reaches its last token. The sampled
    token depends only on the token ids (:meth:`next_token`), so any correct scheduler and cache produce exactly
    :meth:`reference` outputs. ``extra_keys_of`` gives a request's cache salt, which real KV depends on too.
    """

    def __init__(self, block_size: int, extra_keys_of: Callable[[str], tuple[str, ...]] = lambda _: (),
                 vocab_size: int = 997) -> None:
        self.block_size = block_size
        self.extra_keys_of = extra_keys_of
        self.vocab_size = vocab_size
        self.slots: dict[int, int] = {}
        self.requests: dict[str, _SimRequest] = {}
        self.num_forwards = 0

    def next_token(self, token_ids: Seq[int]) -> int:
        """The token this fake model always picks after ``token_ids``."""
        return prefix_fingerprints(token_ids)[-1] % self.vocab_size

    def reference(self, prompt: Seq[int], num_tokens: int) -> list[int]:
        """The first ``num_tokens`` outputs for ``prompt``, generated without any scheduler or cache."""
        tokens, out = list(prompt), []
        for _ in range(num_tokens):
            out.append(self.next_token(tokens))
            tokens.append(out[-1])
        return out

    def _apply(self, plan: SchedulerOutput) -> list[tuple[str, int]]:
        for req_id in plan.finished_ids:
            if self.requests.pop(req_id, None) is None:
                raise AssertionError(f"the plan ends {req_id}, which the runner never saw")
        for req_id in plan.preempted_ids:
            self.requests[req_id].parked, self.requests[req_id].table = True, []
        batch = []
        for new in plan.new_requests:
            if new.req_id in self.requests:
                raise AssertionError(f"the plan sends {new.req_id} as new, but the runner holds it already")
            self.requests[new.req_id] = _SimRequest([*new.prompt_token_ids, *new.output_token_ids],
                                                    list(new.block_ids), new.num_computed_tokens,
                                                    self.extra_keys_of(new.req_id))
            batch.append((new.req_id, new.num_new_tokens))
        for run in plan.running:
            req = self.requests.get(run.req_id)
            if req is None:
                raise AssertionError(f"the plan sends a diff for {run.req_id}, which the runner does not hold")
            if req.parked != run.resumed:
                raise AssertionError(f"{run.req_id}: parked={req.parked} but the diff says resumed={run.resumed}")
            if run.resumed:
                req.table, req.parked = list(run.new_block_ids), False
            else:
                req.table.extend(run.new_block_ids)
                if req.computed != run.num_computed_tokens:
                    raise AssertionError(f"{run.req_id}: the runner computed {req.computed} tokens, the plan says "
                                         f"{run.num_computed_tokens}")
            req.computed = run.num_computed_tokens
            batch.append((run.req_id, run.num_new_tokens))
        return batch

    def _continue(self, req_id: str, req: _SimRequest) -> None:
        """Write the KV of ``req``'s last token, in a slot its table must hold already (the next decode step of a
        continuous run, which the plan gave no new blocks for)."""
        bs, pos = self.block_size, req.computed
        if len(req.table) * bs <= pos:
            raise AssertionError(f"{req_id}: a continuous decode step reaches position {pos} but its block table "
                                 f"{req.table} holds {len(req.table) * bs}")
        self.slots[req.table[pos // bs] * bs + pos % bs] = prefix_fingerprints(req.tokens, req.extra_keys)[pos]
        req.computed = pos + 1

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        """Run one step of ``plan`` and return the sampled tokens."""
        batch = self._apply(plan)
        bs = self.block_size
        for copy in plan.block_copies:
            for offset in range(copy.num_tokens):
                src = copy.src * bs + offset
                if src not in self.slots:
                    raise AssertionError(f"block copy {copy} reads slot {src}, which holds no KV")
                self.slots[copy.dst * bs + offset] = self.slots[src]
        samples: list[RequestSample] = []
        for req_id, num_new in batch:
            req = self.requests[req_id]
            start, end = req.computed, req.computed + num_new
            if len(req.table) * bs < end:
                raise AssertionError(
                    f"{req_id} computes up to position {end} but its block table {req.table} holds "
                    f"{len(req.table) * bs}"
                )
            fingerprints = prefix_fingerprints(req.tokens[:end], req.extra_keys)
            for pos in range(start):
                if self.slots.get(req.table[pos // bs] * bs + pos % bs) != fingerprints[pos]:
                    raise AssertionError(
                        f"{req_id}: the KV at position {pos} (block {req.table[pos // bs]}) is not this request's;"
                        f" the cache reused or kept the wrong block"
                    )
            for pos in range(start, end):
                self.slots[req.table[pos // bs] * bs + pos % bs] = fingerprints[pos]
            req.computed = end
            if end == len(req.tokens):
                tokens = [self.next_token(req.tokens)]
                req.tokens.append(tokens[-1])
                for _ in range(plan.decode_steps - 1):  # continuous decode steps: the sampled token is the input
                    self._continue(req_id, req)
                    tokens.append(self.next_token(req.tokens))
                    req.tokens.append(tokens[-1])
                samples.append(RequestSample(req_id, tokens))
        self.num_forwards += 1
        return RunnerOutput(samples=samples)
