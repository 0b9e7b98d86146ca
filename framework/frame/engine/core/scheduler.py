"""Scheduler: vLLM-style continuous batching, owned by the engine; a policy plugin makes the choices.

The scheduler owns a request's life in the core: :meth:`Scheduler.add_request` registers it once (its grammar
compiled by the structured-output manager, its :class:`~frame.sequence.Sequence` queued), and it leaves only
through a stop, a completed grammar or an abort, its blocks freed. Each step: running requests first (decodes
and unfinished prefill chunks), then waiting ones in the policy's admission order, under a token budget and a
running limit; a prompt longer than the remaining budget is prefilled in chunks; when the pool runs dry, the
policy's victim loses its blocks and is recomputed later. :meth:`Scheduler.schedule` decides which requests
sample and returns the whole step as a :class:`~frame.engine.wire.plan.SchedulerOutput` (data only, grammar
masks included); :meth:`Scheduler.update` then advances progress, publishes KV to the cache, appends the sampled
tokens, applies the stop rules and the grammars, frees the blocks of finished requests and returns the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from frame.engine.core.chunking import Step, prefill_chunk, start_step, waits_for_shared_prefill
from frame.engine.core.outputs import engine_output, hold_prompt_logprobs
from frame.engine.core.stopping import stop_status
from frame.engine.core.structured import StructuredOutputManager
from frame.engine.core.tables import table_diff
from frame.engine.wire.plan import NewRequest, RunnerOutput, RunningRequest, SchedulerOutput
from frame.engine.wire.requests import EngineOutput, EngineRequest
from frame.interfaces.cache import KVCacheStrategy, PrefixMatch
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from frame.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class StepOutcome:
    """What :meth:`Scheduler.update` (or :meth:`Scheduler.abort_requests`) did: tokens appended per request (fewer
    than sampled when a stop cut them), the requests that finished (a stop, a completed grammar, an abort), the
    drafts verified and kept, and the outputs for the clients: every request's new tokens, and finished ones."""

    appended: dict[str, int]
    finished: list[Sequence]
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    outputs: list[EngineOutput] = field(default_factory=list)


class Scheduler:
    """Queues, budget, chunking, preemption, stop rules and freeing, around a plugin's policy.

    Single-threaded: the engine core calls :meth:`add_request` and :meth:`abort_requests` between steps, and
    :meth:`schedule` then :meth:`update` once per step. ``structured`` (None: no request may be constrained)
    holds the grammar matchers; ``eos_token_ids`` end every request that does not ignore them.
    """

    def __init__(self, limits: SchedulerLimits, cache: KVCacheStrategy, policy: SchedulingPolicy,
                 structured: StructuredOutputManager | None = None, eos_token_ids: frozenset[int] = frozenset(),
                 ) -> None:
        self.limits = limits
        self.cache = cache
        self.policy = policy
        self.structured = structured
        self.eos_token_ids = eos_token_ids
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._live: dict[str, Sequence] = {}
        # Block ids the runner holds per request it has seen; a preempted request stays here (its tokens are
        # kept by the runner) and is resumed with a whole new table.
        self._runner_blocks: dict[str, list[int]] = {}  # per request, each KV group's table length the runner holds
        self._resumed: set[str] = set()
        self._ended: list[str] = []
        self._step = 0

    # -- PrefixLookup, for the policy ---------------------------------------------------------------------
    def cached_prefix_tokens(self, seq: Sequence) -> int:
        return self._match(seq).num_tokens

    def _match(self, seq: Sequence) -> PrefixMatch:
        """The cached prefix ``seq`` may take: none when it asks for prompt logprobs (each position needs logits)."""
        return PrefixMatch(0) if seq.params.prompt_logprobs is not None else self.cache.match(seq)

    # -- queues -------------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_requests(self) -> int:
        """Requests the scheduler holds, running or waiting."""
        return len(self._live)

    def outstanding_tokens(self) -> int:
        """Tokens still to compute for the requests held: prompt (and recomputed) tokens not yet in the KV cache,
        plus the output tokens each may still produce (to ``max_tokens``, else to the context's end). What a
        data-parallel router weighs cores by."""
        total = 0
        for seq in self._live.values():
            limit = seq.params.max_tokens or self.limits.max_model_len - seq.num_prompt_tokens
            total += seq.num_uncomputed_tokens + max(0, limit - seq.num_output_tokens)
        return total

    def add_request(self, req: EngineRequest) -> Sequence:
        """Register a client's request: its constraint compiled first (a bad one raises here, before anything is
        held), then its sequence queued. An id already held raises ValueError."""
        if req.request_id in self._live:
            raise ValueError(f"request id {req.request_id} is already running")
        if req.params.structured_outputs is not None:
            if self.structured is None:
                raise ValueError("this scheduler was built without a structured-output manager")
            self.structured.add(req.request_id, req.params.structured_outputs)
        seq = Sequence(
            seq_id=req.request_id, prompt_token_ids=list(req.prompt_token_ids), params=req.params,
            arrival_time=req.arrival_time, priority=req.priority, cache_salt=req.cache_salt,
            eos_token_ids=self.eos_token_ids,
        )
        self.add(seq)
        return seq

    def abort_requests(self, seq_ids: list[str]) -> StepOutcome:
        """Abort requests wherever they are (their blocks return to the pool); unknown ids are ignored."""
        finished = [seq for seq_id in seq_ids if (seq := self.abort(seq_id)) is not None]
        return StepOutcome({}, finished, outputs=[engine_output(seq, None, 0, final=True) for seq in finished])

    def add(self, seq: Sequence) -> None:
        if seq.finished:
            raise ValueError(f"sequence {seq.seq_id} is already finished ({seq.status.value}); add a new one")
        if seq.seq_id in self._live:
            raise ValueError(f"sequence {seq.seq_id} is already queued")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._live[seq.seq_id] = seq

    def abort(self, seq_id: str) -> Sequence | None:
        """Remove a request wherever it is, free its blocks, mark it FINISHED_ABORTED; None if unknown."""
        return self.finish(seq_id, SequenceStatus.FINISHED_ABORTED)

    def finish(self, seq_id: str, status: SequenceStatus) -> Sequence | None:
        """End a request wherever it is with ``status`` (an abort, or a stop the engine decided: a completed
        grammar), freeing its blocks; None if unknown."""
        seq = self._live.get(seq_id)
        if seq is None:
            return None
        (self.running if seq in self.running else self.waiting).remove(seq)
        self._end(seq, status)
        return seq

    def _end(self, seq: Sequence, status: SequenceStatus, reason: int | str | None = None) -> None:
        if self.structured is not None:
            self.structured.forget(seq.seq_id)
        self.cache.free(seq)
        seq.finish(status, reason)
        del self._live[seq.seq_id]
        self._resumed.discard(seq.seq_id)
        if self._runner_blocks.pop(seq.seq_id, None) is not None:
            self._ended.append(seq.seq_id)

    # -- one step -----------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Decide the next step; allocates blocks through the cache strategy and may preempt."""
        step = start_step(self.limits, self.running)
        self._schedule_running(step)
        if not step.preempted:
            self._admit(step)
        return self._plan(step, self._continuous_steps(step))

    def _continuous_steps(self, step: Step) -> int:
        """How many decode steps this step's batch runs back to back (SGLang's continuous decode steps): up to
        :attr:`~frame.interfaces.scheduler.SchedulerLimits.num_continuous_decode_steps` while every scheduled request
        is a plain decode (no drafts, no grammar) and nothing waits, no more than any of them may still gain, and
        only once each holds KV slots for them; else 1."""
        steps = self.limits.num_continuous_decode_steps
        if (steps == 1 or self.waiting or step.preempted or step.spec or not step.scheduled
                or (self.structured is not None and self.structured.active)
                or any(n != 1 or seq.num_uncomputed_tokens != 1 for seq, n in step.scheduled)):
            return 1
        steps = min(steps, 1 + step.budget // len(step.scheduled), *(self._room(seq) for seq, _ in step.scheduled))
        # A request that got its slots and one that did not: the first keeps a block early, used by its next steps.
        if steps == 1 or any(self.cache.allocate(seq, steps) is None for seq, _ in step.scheduled):
            return 1
        return steps

    def _schedule_running(self, step: Step) -> None:
        index = 0
        while index < len(self.running) and step.budget > 0:
            seq = self.running[index]
            # Drafts ride as lookahead slots after a decode's token, as many as the budget leaves room for.
            spec = seq.spec_token_ids[: step.budget - 1] if seq.num_uncomputed_tokens == 1 else []
            num_new = min(seq.num_uncomputed_tokens + len(spec), step.budget)
            if self.limits.enable_chunked_prefill and seq.num_uncomputed_tokens > 1:
                num_new = prefill_chunk(self.policy, seq, seq.num_uncomputed_tokens, step, len(self._live), False)
            if num_new == 0 or (not self.limits.enable_chunked_prefill and num_new < seq.num_uncomputed_tokens):
                index += 1
                continue
            while self.cache.allocate(seq, num_new) is None:
                victim = self.policy.preemption_victim(self.running)
                self._preempt(victim, step)
                if victim is seq:
                    break
            else:
                step.scheduled.append((seq, num_new))
                step.budget -= num_new
                if spec:
                    step.spec[seq.seq_id] = spec
            # Preempting an earlier request shifts the list; re-find where this one stands.
            if seq in self.running:
                index = self.running.index(seq) + 1

    def _admit(self, step: Step) -> None:
        admitted: set[str] = set()
        for seq in self.policy.admission_order(self.waiting, self):
            if step.budget <= 0 or len(self.running) >= self.limits.max_num_seqs:
                break
            match = self._match(seq)
            shares = seq.params.prompt_logprobs is None
            if shares and waits_for_shared_prefill(seq, match.num_tokens, step, self.cache, self.policy):
                continue
            remaining = seq.num_tokens - match.num_tokens
            num_new = min(remaining, step.budget)
            if self.limits.enable_chunked_prefill:
                num_new = prefill_chunk(self.policy, seq, remaining, step, len(self._live), True)
            if num_new == 0 or (not self.limits.enable_chunked_prefill and num_new < remaining):
                continue
            allocation = self.cache.allocate(seq, num_new, match)
            if allocation is None:
                break
            seq.num_computed_tokens += allocation.num_cached_tokens
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = allocation.num_cached_tokens
            step.copies.extend(allocation.copies)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            admitted.add(seq.seq_id)
            step.scheduled.append((seq, num_new))
            step.budget -= num_new
        if admitted:
            self.waiting = [s for s in self.waiting if s.seq_id not in admitted]

    def _preempt(self, victim: Sequence, step: Step) -> None:
        self.running.remove(victim)
        self.cache.free(victim)
        victim.reset_for_recompute()
        self.waiting.insert(0, victim)
        step.preempted.append(victim)
        step.drop(victim)
        self.num_preemptions += 1
        if victim.seq_id in self._runner_blocks:
            self._resumed.add(victim.seq_id)

    def _plan(self, step: Step, decode_steps: int = 1) -> SchedulerOutput:
        new: list[NewRequest] = []
        running: list[RunningRequest] = []
        constrained = self.structured is not None and self.structured.active
        sampling: list[tuple[str, list[int]]] = []  # the constrained step's sampling requests, with their drafts
        prompt_tokens = 0
        for seq, num_new in step.scheduled:
            drafts = step.spec.get(seq.seq_id, [])
            samples = seq.num_computed_tokens + num_new == seq.num_tokens + len(drafts)  # reaches its last token
            if constrained and samples:
                sampling.append((seq.seq_id, drafts))
            if seq.is_prefilling:
                prompt_tokens += min(num_new, seq.num_prompt_tokens - seq.num_computed_tokens)
            held = self._runner_blocks.get(seq.seq_id)
            resumed = held is not None and seq.seq_id in self._resumed
            block_ids, group_block_ids, self._runner_blocks[seq.seq_id] = table_diff(self.cache, seq.seq_id, held,
                                                                                     resumed)
            if held is None:
                new.append(NewRequest(
                    req_id=seq.seq_id, prompt_token_ids=list(seq.prompt_token_ids),
                    output_token_ids=list(seq.output_token_ids), params=seq.params, block_ids=block_ids,
                    group_block_ids=group_block_ids, num_computed_tokens=seq.num_computed_tokens,
                    num_new_tokens=num_new, eos_token_ids=sorted(seq.eos_token_ids), samples=samples,
                ))
            else:
                self._resumed.discard(seq.seq_id)
                running.append(RunningRequest(
                    req_id=seq.seq_id, new_block_ids=block_ids, new_group_block_ids=group_block_ids,
                    num_computed_tokens=seq.num_computed_tokens, num_new_tokens=num_new, resumed=resumed,
                    spec_token_ids=drafts, samples=samples,
                ))
        ended, self._ended = self._ended, []
        self._step += 1
        grammar_ids: list[str] = []
        grammar_bitmask = b""
        if constrained:
            grammar_ids, _, rows = self.structured.masks(sampling)  # type: ignore[union-attr]
            grammar_bitmask = rows.astype("<i4").tobytes()
        return SchedulerOutput(
            step=self._step, num_prompt_tokens=prompt_tokens, new_requests=new, running=running,
            block_copies=step.copies, preempted_ids=[s.seq_id for s in step.preempted], finished_ids=ended,
            grammar_ids=grammar_ids, grammar_bitmask=grammar_bitmask, decode_steps=decode_steps,
        )

    # -- after the step -----------------------------------------------------------------------------------
    def update(self, plan: SchedulerOutput, output: RunnerOutput) -> StepOutcome:
        """Account for a finished step: sampled tokens, stop rules, progress, KV publication, freeing, drafts."""
        samples = {s.req_id: s for s in output.samples}
        appended: dict[str, int] = {}
        finished: list[Sequence] = []
        drafted = accepted = 0
        hold_prompt_logprobs(output.prompt_logprobs, self._live)
        for req in (*plan.new_requests, *plan.running):
            seq = self._live.get(req.req_id)
            if seq is None:  # aborted between schedule() and update()
                continue
            spec = req.spec_token_ids if isinstance(req, RunningRequest) else []
            seq.spec_token_ids = []
            if not req.samples:  # a prefill chunk short of the prompt's end
                seq.num_computed_tokens += req.num_new_tokens
                self.cache.commit(seq)
                continue
            sample = samples.get(req.req_id)
            if sample is None:
                raise ValueError(f"the step sampled request {req.req_id} but no result was reported for it")
            # Tokens past the first: drafts the target agreed with, or the later of continuous decode steps.
            kept = len(sample.token_ids) - 1
            drafted, accepted = drafted + len(spec), accepted + min(kept, len(spec))
            count, stop = self._append(seq, sample.token_ids)
            appended[req.req_id] = count
            # KV is valid for the last real token and the kept drafts (the rejected drafts' slots are rewritten
            # later), or for each input of continuous decode steps, and never for more tokens than a stop left in
            # the sequence.
            seq.num_computed_tokens = min(seq.num_computed_tokens + req.num_new_tokens - (len(spec) - kept),
                                          seq.num_tokens)
            self.cache.commit(seq)
            if stop is not None:
                self.running.remove(seq)
                self._end(seq, *stop)
                finished.append(seq)
                continue
            seq.spec_token_ids = sample.draft_token_ids[: self._draft_room(seq)]
        finished += self._follow_grammars(output, finished)
        ended = {seq.seq_id: seq for seq in finished}
        outputs = []
        for sample in output.samples:
            count = appended.get(sample.req_id, 0)
            seq = self._live.get(sample.req_id) or ended.get(sample.req_id)
            if count and seq is not None:
                outputs.append(engine_output(seq, sample, count, final=sample.req_id in ended))
        return StepOutcome(appended, finished, drafted, accepted, outputs)

    def _follow_grammars(self, output: RunnerOutput, finished: list[Sequence]) -> list[Sequence]:
        """End the requests whose grammar the step's tokens completed (see :meth:`StructuredOutputManager.follow`)."""
        if self.structured is None or not self.structured.active:
            return []
        done = {s.seq_id for s in finished}
        completed = self.structured.follow(output.samples, self._live, done)
        return [seq for seq_id in completed if (seq := self.finish(seq_id, SequenceStatus.FINISHED_STOPPED))]

    def _append(self, seq: Sequence, tokens: list[int]) -> tuple[int, tuple[SequenceStatus, int | None] | None]:
        """Append sampled tokens one by one until a stop rule says ``seq`` is done; returns how many were
        appended and the stop (None: still running)."""
        for count, token in enumerate(tokens, start=1):
            seq.append_token(token)
            stop = stop_status(seq, self.limits.max_model_len)
            if stop is not None:
                return count, stop
        return len(tokens), None

    def _room(self, seq: Sequence) -> int:
        """Tokens ``seq`` may still gain: up to ``max_tokens`` and the context length."""
        room = self.limits.max_model_len - seq.num_tokens
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens)
        return room

    def _draft_room(self, seq: Sequence) -> int:
        """Drafts worth verifying: a step that keeps them all adds one token more, which must still fit."""
        limit = seq.params.num_speculative_tokens
        room = self._room(seq) - 1
        return max(0, room if limit is None else min(room, limit))
