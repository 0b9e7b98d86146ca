"""Test doubles for the conformance suites: small, obviously correct stand-ins for real plugins.

:class:`PagedAllocatorDouble` is a KV-cache strategy that pages but never reuses anything. It lets the scheduler
suite run without any cache plugin installed, and isolates scheduler bugs from cache bugs.
:class:`SimulatedModel` stands in for the model runner: it checks the KV bookkeeping of every step and samples a
deterministic token, with no tensors. Both are test doubles: never use them for serving.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence as Seq

from frame.interfaces.cache import Allocation, CacheSequence, KVCacheStrategy, PrefixMatch
from frame.interfaces.scheduler import SchedulerOutput, StepResult


class PagedAllocatorDouble(KVCacheStrategy):
    """TEST DOUBLE: a paged allocator with no prefix reuse (every match is empty, nothing stays cached).

    Free blocks are handed out lowest id first; freeing returns them to the free list at once.
    """

    reuses_prefixes = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() yields the lowest id
        self._tables: dict[str, list[int]] = {}

    def match(self, seq: CacheSequence) -> PrefixMatch:
        return PrefixMatch(0)

    def allocate(
        self, seq: CacheSequence, num_new_tokens: int, match: PrefixMatch | None = None
    ) -> Allocation | None:
        table = self._tables.get(seq.seq_id)
        claiming = table is None
        need = self.num_blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(table or ())
        if need > len(self._free):
            return None
        table = self._tables.setdefault(seq.seq_id, [])
        table.extend(self._free.pop() for _ in range(max(need, 0)))
        if claiming:
            self.stats.queries += 1
            self.stats.query_tokens += seq.num_prompt_tokens
        self.track_usage(self.num_blocks - len(self._free))
        return Allocation()

    def commit(self, seq: CacheSequence) -> None:
        table = self._tables.get(seq.seq_id, [])
        if self.num_blocks_needed(seq.num_computed_tokens) > len(table):
            raise AssertionError(
                f"{seq.seq_id} committed {seq.num_computed_tokens} tokens but holds only {len(table)} blocks"
            )

    def free(self, seq: CacheSequence) -> None:
        table = self._tables.pop(seq.seq_id, [])
        self._free.extend(reversed(table))
        self.track_usage(self.num_blocks - len(self._free))

    def block_table(self, seq_id: str) -> Seq[int]:
        return tuple(self._tables.get(seq_id, ()))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def reset(self) -> bool:
        # Nothing is ever cached, so there is nothing to drop; refuse only while blocks are in use.
        return not self._tables


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


class SimulatedModel:
    """TEST DOUBLE of the model runner and model: checks the KV bookkeeping, then "samples" a fixed token.

    :meth:`execute` performs the step's block copies on a simulated slot store, checks that every already
    computed position of each scheduled sequence finds its own KV in the slot its block table names (so a cache
    that hands out a wrong or evicted block, or a scheduler that loses track of progress, fails loudly), writes
    the KV of the new tokens, and returns a result for each sequence whose step reaches its last token. The
    sampled token depends only on the sequence's token ids (:meth:`next_token`), so any correct scheduler and
    cache produce exactly :meth:`reference` outputs.
    """

    def __init__(self, cache: KVCacheStrategy, vocab_size: int = 997) -> None:
        self.cache = cache
        self.vocab_size = vocab_size
        self.slots: dict[int, int] = {}
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

    def execute(self, output: SchedulerOutput) -> dict[str, StepResult]:
        """Run one step of ``output`` and return the sampled tokens by sequence id."""
        bs = self.cache.block_size
        for copy in output.copies:
            for offset in range(copy.num_tokens):
                src = copy.src * bs + offset
                if src not in self.slots:
                    raise AssertionError(f"block copy {copy} reads slot {src}, which holds no KV")
                self.slots[copy.dst * bs + offset] = self.slots[src]
        results: dict[str, StepResult] = {}
        for item in output.scheduled:
            seq = item.seq
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
            table = list(self.cache.block_table(seq.seq_id))
            if len(table) * bs < end:
                raise AssertionError(
                    f"{seq.seq_id} computes up to position {end} but its block table {table} holds {len(table) * bs}"
                )
            fingerprints = prefix_fingerprints(seq.token_ids[:end], seq.extra_keys)
            for pos in range(start):
                if self.slots.get(table[pos // bs] * bs + pos % bs) != fingerprints[pos]:
                    raise AssertionError(
                        f"{seq.seq_id}: the KV at position {pos} (block {table[pos // bs]}) is not this sequence's;"
                        f" the cache reused or kept the wrong block"
                    )
            for pos in range(start, end):
                self.slots[table[pos // bs] * bs + pos % bs] = fingerprints[pos]
            if item.samples:
                results[seq.seq_id] = StepResult(self.next_token(seq.token_ids))
        self.num_forwards += 1
        return results
