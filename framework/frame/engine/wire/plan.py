"""The step plan and the step's result: plain msgspec values that cross a process boundary.

The scheduler decides a step as a :class:`SchedulerOutput`; every model worker (one per tensor-parallel rank, in
this process or another) applies it to its own persistent batch and runs the forward; the driver worker answers
with a :class:`RunnerOutput`. Neither side holds a reference to the other's objects: a request first reaches the
runner as a :class:`NewRequest` (its prompt, sampling parameters and block ids), and after that only as a
:class:`RunningRequest` diff (blocks added, tokens to compute). Tokens the runner samples it appends to its own
copy of the request, so they never travel back in a plan.
"""

from __future__ import annotations

import msgspec

from frame.engine.wire.requests import TokenLogprobs
from frame.interfaces.cache import BlockCopy
from frame.sampling_params import SamplingParams


class NewRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A request the runner has not seen: everything it needs to keep the request's row in its batch.

    ``output_token_ids`` is empty unless the request generated tokens before the runner first saw it.
    ``num_computed_tokens`` leading tokens already have KV in ``block_ids`` (a prefix-cache hit); this step
    computes the next ``num_new_tokens``. ``eos_token_ids`` are the model's end tokens, which ``min_tokens`` bans.
    ``samples``: the scheduler's decision that this step reaches the request's last token, so the runner samples
    its logits (False for a prefill chunk short of the prompt's end). ``group_block_ids`` are the block tables of
    the KV groups after the first (:mod:`frame.interfaces.kv_groups`; empty for a model with one group).
    """

    req_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = []
    params: SamplingParams
    block_ids: list[int]
    group_block_ids: list[list[int]] = []
    num_computed_tokens: int
    num_new_tokens: int
    eos_token_ids: list[int] = []
    samples: bool = False


class RunningRequest(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A request the runner already holds, as a diff: blocks appended to its table and tokens to compute now.

    ``num_computed_tokens`` is the scheduler's count before this step (the runner checks it against its own).
    When ``resumed`` is True the request was preempted since the runner last ran it: its KV is gone, and
    ``new_block_ids`` is its whole new table, not an addition. ``spec_token_ids`` are drafts to verify: the step's
    ``num_new_tokens`` count them after the request's last real token. ``samples`` as in :class:`NewRequest`;
    ``new_group_block_ids`` as ``new_block_ids`` for each KV group after the first.
    """

    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int
    num_new_tokens: int
    resumed: bool = False
    spec_token_ids: list[int] = []
    samples: bool = False
    new_group_block_ids: list[list[int]] = []


class SchedulerOutput(msgspec.Struct, frozen=True, kw_only=True):
    """One step: what to compute, in what order, and what to forget.

    The batch is ``new_requests`` and ``running`` (each with its ``num_new_tokens``; prefills, prefill chunks and
    decodes mixed); ``num_prompt_tokens`` of the step's tokens are prompt tokens. ``block_copies`` run before the
    forward. ``preempted_ids`` lost their KV in this step (the runner keeps their tokens for a later ``resumed``
    diff); ``finished_ids`` ended (finished or aborted) since
    the previous plan, and the runner drops everything it holds for them. ``grammar_bitmask`` holds the
    structured-output masks (int32 little-endian rows, :mod:`frame.interfaces.grammar`) of the requests in
    ``grammar_ids``, one row per position each samples (its last token, then each draft), in that order.
    With ``decode_steps`` above 1 every request is a decode that samples up to that many tokens, one a step.
    """

    step: int
    num_prompt_tokens: int = 0
    new_requests: list[NewRequest] = []
    running: list[RunningRequest] = []
    block_copies: list[BlockCopy] = []
    preempted_ids: list[str] = []
    finished_ids: list[str] = []
    grammar_ids: list[str] = []
    grammar_bitmask: bytes = b""
    #: How many decode steps the runner runs back to back (each row's sampled token the next one's input); above 1
    #: only for a batch of plain decodes, each holding KV slots for that many tokens.
    decode_steps: int = 1

    @property
    def num_batched_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.new_requests) + sum(r.num_new_tokens for r in self.running)

    @property
    def num_scheduled(self) -> int:
        return len(self.new_requests) + len(self.running)

    @property
    def is_empty(self) -> bool:
        """True when nothing is computed (the plan may still carry ids to forget)."""
        return not self.new_requests and not self.running

    @property
    def only_moves_decodes_on(self) -> bool:
        """True when every scheduled request is a running plain decode of one token (no drafts, not resumed; it may
        gain blocks) and nothing else changes: no new, finished or preempted request, block copy or grammar."""
        if (self.new_requests or self.finished_ids or self.preempted_ids or self.block_copies or self.grammar_ids):
            return False
        return all(r.num_new_tokens == 1 and r.samples and not r.resumed and not r.spec_token_ids
                   for r in self.running)

    def scheduled_ids(self) -> list[str]:
        """Ids of the step's requests: new ones first, then running ones, each in plan order."""
        return [r.req_id for r in self.new_requests] + [r.req_id for r in self.running]


class RequestSample(msgspec.Struct, frozen=True, array_like=True):
    """The tokens one request gained in a step (one, or several with speculative decoding: the drafts it kept and
    one of the target's), their logprobs, and the proposer's drafts for the next step."""

    req_id: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None = None
    draft_token_ids: list[int] = []


class PromptLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """Prompt logprobs one request gained in a step: ``logprobs[i]`` scores prompt token ``start + i`` (its logprob
    given the tokens before it, and the top alternatives there); ``start`` is at least 1."""

    req_id: str
    start: int
    logprobs: list[TokenLogprobs]


class RunnerOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What the driver worker reports for a step: the samples of every request that reached its last token, and
    the prompt logprobs of the prompt positions the step computed for requests that ask for them.

    ``comm_seconds`` is the time the step's collectives took on the driver rank (0 without tensor parallelism).
    """

    samples: list[RequestSample] = []
    prompt_logprobs: list[PromptLogprobs] = []
    comm_seconds: float = 0.0
