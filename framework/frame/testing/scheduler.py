"""Conformance suite for scheduler plugins: subclass :class:`SchedulerConformance` in your plugin's tests.

A scheduler plugin supplies a :class:`~frame.interfaces.scheduler.SchedulingPolicy`; the suite runs it inside the
engine's own scheduler over a KV-cache strategy, with :class:`~frame.testing.doubles.SimulatedModel` (no tensors)
executing each step plan, through whole workloads. It checks, at every step, that the limits hold and the KV
bookkeeping is right; at the end, that every sequence got exactly the tokens the fake model gives without any
scheduler, and that no block leaked. A subclass provides the ``scheduler_factory`` fixture (``limits -> policy``)
and may override ``cache_factory`` (default: :class:`~frame.testing.doubles.PagedAllocatorDouble`)::

    class TestMyScheduler(SchedulerConformance):
        @pytest.fixture
        def scheduler_factory(self):
            return scheduler_plugin_factory("mine")
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from frame.engine.core.scheduler import Scheduler
from frame.engine.wire.plan import RunnerOutput, SchedulerOutput
from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from frame.sampling_params import SamplingParams
from frame.sequence import Sequence, SequenceStatus
from frame.testing.doubles import PagedAllocatorDouble, SimulatedModel

CacheFactory = Callable[[int, int], KVCacheStrategy]
SchedulerFactory = Callable[[SchedulerLimits], SchedulingPolicy]

#: Consecutive steps that may schedule nothing while work remains (a step that only preempts is one).
MAX_IDLE_STEPS = 2


def make_prompt(seed: int, length: int, vocab: int = 30_000) -> list[int]:
    """A deterministic prompt of ``length`` token ids; different seeds give different prompts."""
    state, out = seed * 2_654_435_761 + 97, []
    for _ in range(length):
        state = (state * 6_364_136_223_846_793_005 + 1_442_695_040_888_963_407) % (1 << 64)
        out.append(1 + (state >> 33) % (vocab - 1))
    return out


def expected_output(reference: list[int], stop_ids: Collection[int], min_tokens: int = 0) -> list[int]:
    """``reference`` cut after the first token in ``stop_ids`` that comes at or after ``min_tokens`` outputs."""
    for index, token in enumerate(reference):
        if index + 1 >= min_tokens and token in stop_ids:
            return reference[: index + 1]
    return reference


@functools.cache
def _hooks() -> Any:
    from frame.plugins.hooks import PluginHooks  # imported late: it pulls in torch for the other kinds
    from frame.plugins.registry import PluginRegistry

    return PluginHooks(PluginRegistry())


def plugin_installed(kind: str, name: str) -> bool:
    """True when a plugin of ``kind`` named ``name`` is installed and enabled here."""
    from frame.plugins.registry import PluginRegistry

    return name in PluginRegistry().names(kind)


def scheduler_plugin_factory(name: str, **options: Any) -> SchedulerFactory:
    """A factory creating the policy of the installed scheduler plugin ``name`` through its hooks, with
    ``options``."""
    hooks = _hooks()
    model = hooks.options_model("scheduler", name)
    validated: BaseModel | None = model(**options) if model is not None else None
    return lambda limits: hooks.create_scheduler(name, limits, validated)


def cache_plugin_factory(name: str, **options: Any) -> CacheFactory:
    """A factory creating the installed cache plugin ``name`` through its hooks, with ``options``."""
    hooks = _hooks()
    model = hooks.options_model("cache", name)
    validated: BaseModel | None = model(**options) if model is not None else None
    return lambda num_blocks, block_size: hooks.create_cache(name, num_blocks, block_size, validated)


def cache_params(*names: str) -> list[Any]:
    """Pytest params for a ``cache_factory`` fixture: the test double, then each named cache plugin (skipped
    when not installed). Turn one into a factory with :func:`cache_factory_for`."""
    params = [pytest.param("double", id="double")]
    for name in names:
        missing = pytest.mark.skipif(not plugin_installed("cache", name), reason=f"cache plugin {name} not installed")
        params.append(pytest.param(name, id=name, marks=missing))
    return params


def cache_factory_for(name: str) -> CacheFactory:
    """``"double"``: :class:`PagedAllocatorDouble`; any other name: that installed cache plugin."""
    return PagedAllocatorDouble if name == "double" else cache_plugin_factory(name)


@dataclass
class RunReport:
    """What a :class:`SchedulerHarness` observed over its steps."""

    steps: int = 0
    preemptions: int = 0
    max_running: int = 0
    max_batched_tokens: int = 0
    #: Sequence id -> steps that computed part of its prompt (more than one means it was chunked).
    prefill_steps: dict[str, int] = field(default_factory=dict)
    #: Sequence ids that were scheduled for fewer tokens than they had left to compute.
    chunked: set[str] = field(default_factory=set)
    finished: list[Sequence] = field(default_factory=list)


class SchedulerHarness:
    """Drives a policy inside the engine's scheduler over one cache, executing every plan on the simulated model
    and checking the invariants of every step."""

    def __init__(self, policy: SchedulingPolicy, cache: KVCacheStrategy, limits: SchedulerLimits) -> None:
        self.scheduler = Scheduler(limits, cache, policy)
        self.cache = cache
        self.limits = limits
        self.live: dict[str, Sequence] = {}
        self.model = SimulatedModel(cache.block_size, lambda req_id: self.live[req_id].extra_keys)
        self.report = RunReport()
        self._count = 0
        self._idle = 0

    def add(self, prompt: list[int], *, priority: int = 0, salt: str | None = None,
            eos: Collection[int] = (), **params: Any) -> Sequence:
        """Queue a sequence (``params`` are SamplingParams fields; ``ignore_eos`` defaults to True here)."""
        params.setdefault("ignore_eos", True)
        self._count += 1
        seq = Sequence(f"seq-{self._count}", list(prompt), SamplingParams(**params), arrival_time=float(self._count),
                       priority=priority, cache_salt=salt, eos_token_ids=frozenset(eos))
        self.scheduler.add(seq)
        self.live[seq.seq_id] = seq
        return seq

    def abort(self, seq_id: str) -> Sequence | None:
        """Abort through the scheduler and check the sequence let go of its blocks."""
        seq = self.scheduler.abort(seq_id)
        if seq is not None:
            assert seq.status is SequenceStatus.FINISHED_ABORTED, f"aborted {seq_id} has status {seq.status}"
            assert not self.cache.block_table(seq_id), f"aborted {seq_id} still holds blocks"
            self.live.pop(seq_id)
        return seq

    def scheduled(self, plan: SchedulerOutput) -> list[tuple[Sequence, int]]:
        """The plan's requests as ``(sequence, new tokens)``, in batch order (read before :meth:`finish_step`)."""
        return [(self.live[r.req_id], r.num_new_tokens) for r in (*plan.new_requests, *plan.running)]

    def preempted(self, plan: SchedulerOutput) -> list[Sequence]:
        """The sequences the plan preempted."""
        return [self.live[req_id] for req_id in plan.preempted_ids]

    def step(self) -> list[Sequence]:
        """One schedule, forward and update; returns the sequences that finished."""
        plan = self.scheduler.schedule()
        self._check_schedule(plan)
        return self.finish_step(plan, self.model.execute(plan))

    def finish_step(self, plan: SchedulerOutput, output: RunnerOutput) -> list[Sequence]:
        """The update half of :meth:`step` (split so a test can act between the forward and the update)."""
        finished = self.scheduler.update(plan, output).finished
        for seq in finished:
            assert seq.finished, f"update returned {seq.seq_id} as finished with status {seq.status}"
            assert self.live.pop(seq.seq_id, None) is seq, f"{seq.seq_id} finished twice or was never live"
            assert not self.cache.block_table(seq.seq_id), f"finished {seq.seq_id} still holds blocks"
        self.report.finished.extend(finished)
        self.report.steps += 1
        counted = self.scheduler.num_waiting + self.scheduler.num_running
        assert counted == len(self.live), f"the queues hold {counted} sequences but {len(self.live)} are unfinished"
        return finished

    def run(self, max_steps: int = 5000) -> RunReport:
        """Step until nothing is unfinished; fails if that takes more than ``max_steps``."""
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished():
                return self.report
            self.step()
        raise AssertionError(f"{len(self.live)} sequences still unfinished after {max_steps} steps")

    def _check_schedule(self, plan: SchedulerOutput) -> None:
        limits, report = self.limits, self.report
        assert plan.num_batched_tokens <= limits.max_num_batched_tokens, (
            f"step batches {plan.num_batched_tokens} tokens over the budget of {limits.max_num_batched_tokens}")
        assert self.scheduler.num_running <= limits.max_num_seqs, (
            f"{self.scheduler.num_running} sequences run, over max_num_seqs={limits.max_num_seqs}")
        ids = plan.scheduled_ids()
        assert len(ids) == len(set(ids)), f"a sequence is scheduled twice in one step: {ids}"
        for victim in self.preempted(plan):
            report.preemptions += 1
            assert victim.seq_id not in ids, f"preempted {victim.seq_id} is still scheduled"
            assert victim.status is SequenceStatus.PREEMPTED, f"preempted {victim.seq_id} has status {victim.status}"
            assert not self.cache.block_table(victim.seq_id), f"preempted {victim.seq_id} still holds blocks"
        for seq, num_new in self.scheduled(plan):
            assert seq.status is SequenceStatus.RUNNING, f"scheduled {seq.seq_id} has status {seq.status}"
            assert 1 <= num_new <= seq.num_uncomputed_tokens, (
                f"{seq.seq_id} scheduled for {num_new} of {seq.num_uncomputed_tokens} uncomputed tokens")
            if num_new < seq.num_uncomputed_tokens:
                assert limits.enable_chunked_prefill, f"{seq.seq_id} was chunked with chunked prefill off"
                report.chunked.add(seq.seq_id)
            if seq.is_prefilling:
                report.prefill_steps[seq.seq_id] = report.prefill_steps.get(seq.seq_id, 0) + 1
        report.max_running = max(report.max_running, self.scheduler.num_running)
        report.max_batched_tokens = max(report.max_batched_tokens, plan.num_batched_tokens)
        self._idle = self._idle + 1 if plan.is_empty and self.scheduler.has_unfinished() else 0
        assert self._idle <= MAX_IDLE_STEPS, f"no progress for {self._idle} steps with {len(self.live)} unfinished"

    def assert_no_leak(self) -> None:
        """Everything finished: every block is free again and the cache can be reset."""
        assert not self.scheduler.has_unfinished(), "sequences are still queued"
        assert self.cache.num_free_blocks == self.cache.num_blocks, (
            f"{self.cache.num_blocks - self.cache.num_free_blocks} blocks leaked")
        assert self.cache.stats.blocks_in_use == 0, f"stats say {self.cache.stats.blocks_in_use} blocks are in use"
        assert self.cache.reset(), "the cache refuses to reset although no sequence holds a block"
        assert self.scheduler.schedule().is_empty, "a step with nothing queued scheduled something"


class SchedulerConformance:
    """The tests every scheduler plugin passes. Subclass it and define the ``scheduler_factory`` fixture.

    Outputs are compared with :meth:`SimulatedModel.reference`, which involves no scheduler and no cache, so
    passing schedulers produce identical outputs for identical workloads.
    """

    block_size = 4

    @pytest.fixture
    def cache_factory(self) -> CacheFactory:
        """Override to run the suite over a real cache plugin (see :func:`cache_plugin_factory`)."""
        return PagedAllocatorDouble

    @pytest.fixture
    def scheduler_factory(self) -> SchedulerFactory:
        """Override: return ``limits -> SchedulingPolicy`` for the plugin under test (see
        :func:`scheduler_plugin_factory`)."""
        pytest.fail(f"{type(self).__name__} must define the scheduler_factory fixture")

    @pytest.fixture
    def make(self, scheduler_factory: SchedulerFactory, cache_factory: CacheFactory) -> Callable[..., SchedulerHarness]:
        def build(*, num_blocks: int = 64, max_num_seqs: int = 4, max_num_batched_tokens: int = 32,
                  max_model_len: int = 256, chunked: bool = True) -> SchedulerHarness:
            cache = cache_factory(num_blocks, self.block_size)
            limits = SchedulerLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                     max_model_len=max_model_len, enable_chunked_prefill=chunked)
            return SchedulerHarness(scheduler_factory(limits), cache, limits)

        return build

    @staticmethod
    def assert_reference_outputs(h: SchedulerHarness, seqs: list[Sequence]) -> None:
        for seq in seqs:
            want = h.model.reference(seq.prompt_token_ids, seq.params.max_tokens or 0)
            assert seq.status is SequenceStatus.FINISHED_LENGTH, f"{seq.seq_id} ended with {seq.status}"
            assert seq.output_token_ids == want, f"{seq.seq_id} produced other tokens than the fake model's"

    # -- the tests ----------------------------------------------------------------------------------------
    def test_nothing_to_do_is_an_empty_step(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make()
        out = h.scheduler.schedule()
        assert out.is_empty and not out.preempted_ids and not out.block_copies and out.num_batched_tokens == 0
        assert h.scheduler.update(out, RunnerOutput()).finished == []
        assert not h.scheduler.has_unfinished() and h.scheduler.num_waiting == h.scheduler.num_running == 0

    def test_every_sequence_gets_exactly_max_tokens(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make()
        seqs = [h.add(make_prompt(i, 3 + 5 * i), max_tokens=1 + (3 * i) % 9) for i in range(8)]
        h.run()
        self.assert_reference_outputs(h, seqs)
        h.assert_no_leak()

    def test_limits_are_never_exceeded_and_are_used(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make(max_num_seqs=3, max_num_batched_tokens=16, num_blocks=128)
        seqs = [h.add(make_prompt(i, 10 + i % 7), max_tokens=4 + i % 5) for i in range(12)]
        report = h.run()  # the harness checks the budget and max_num_seqs at every step
        assert report.max_running == 3 and report.max_batched_tokens == 16
        self.assert_reference_outputs(h, seqs)
        h.assert_no_leak()

    def test_long_prompt_is_prefilled_in_chunks(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make(max_num_batched_tokens=16)
        long_seq = h.add(make_prompt(1, 50), max_tokens=4)
        short = h.add(make_prompt(2, 5), max_tokens=6)
        report = h.run()
        assert long_seq.seq_id in report.chunked and report.prefill_steps[long_seq.seq_id] >= 4
        self.assert_reference_outputs(h, [long_seq, short])
        h.assert_no_leak()

    def test_without_chunked_prefill_prompts_run_whole(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make(max_num_batched_tokens=64, max_model_len=64, chunked=False)
        seqs = [h.add(make_prompt(i, 20 + 4 * i), max_tokens=6) for i in range(5)]
        report = h.run()
        assert not report.chunked and all(n == 1 for n in report.prefill_steps.values())
        self.assert_reference_outputs(h, seqs)
        h.assert_no_leak()

    def test_small_pool_preempts_and_matches_a_roomy_pool(self, make: Callable[..., SchedulerHarness]) -> None:
        outputs = []
        for num_blocks in (256, 10):
            h = make(num_blocks=num_blocks)
            seqs = [h.add(make_prompt(i, 10 + i), max_tokens=16) for i in range(8)]
            report = h.run()
            assert (report.preemptions > 0) == (num_blocks == 10), f"{report.preemptions} preemptions"
            self.assert_reference_outputs(h, seqs)
            h.assert_no_leak()
            outputs.append([s.output_token_ids for s in seqs])
        assert outputs[0] == outputs[1]

    def test_abort_frees_waiting_and_running(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make(max_num_seqs=2)
        seqs = [h.add(make_prompt(i, 9), max_tokens=20) for i in range(5)]
        for _ in range(3):
            h.step()
        running = next(s for s in seqs if s.status is SequenceStatus.RUNNING)
        waiting = next(s for s in seqs if s.status is SequenceStatus.WAITING)
        assert h.cache.block_table(running.seq_id)
        assert h.abort(running.seq_id) is running and h.abort(waiting.seq_id) is waiting
        assert h.abort(running.seq_id) is None and h.abort("no-such-sequence") is None
        h.run()
        self.assert_reference_outputs(h, [s for s in seqs if s not in (running, waiting)])
        h.assert_no_leak()

    def test_abort_during_the_forward(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make()
        seqs = [h.add(make_prompt(i, 6), max_tokens=5) for i in range(3)]
        out = h.scheduler.schedule()
        results = h.model.execute(out)
        h.abort(seqs[1].seq_id)
        assert seqs[1] not in h.finish_step(out, results)
        h.run()
        self.assert_reference_outputs(h, [seqs[0], seqs[2]])
        h.assert_no_leak()

    def test_add_after_everything_finished(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make()
        first = [h.add(make_prompt(i, 7), max_tokens=3) for i in range(2)]
        h.run()
        h.assert_no_leak()
        second = [h.add(make_prompt(i + 10, 8), max_tokens=5) for i in range(3)]
        h.run()
        self.assert_reference_outputs(h, first + second)
        h.assert_no_leak()

    def test_eos_and_stop_token_ids_stop(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make()
        prompt = make_prompt(7, 9)
        ref = h.model.reference(prompt, 12)
        eos = h.add(prompt, max_tokens=12, ignore_eos=False, eos={ref[4]})
        ignored = h.add(prompt, max_tokens=12, eos={ref[4]})
        stop = h.add(prompt, max_tokens=12, stop_token_ids=[ref[2]], min_tokens=1)
        late = h.add(prompt, max_tokens=12, stop_token_ids=[ref[2]], min_tokens=4)
        h.run()
        assert eos.status is SequenceStatus.FINISHED_STOPPED and eos.stop_reason == ref[4]
        assert eos.output_token_ids == expected_output(ref, {ref[4]})
        assert ignored.output_token_ids == ref
        assert stop.output_token_ids == expected_output(ref, {ref[2]}, min_tokens=1)
        assert late.output_token_ids == expected_output(ref, {ref[2]}, min_tokens=4)
        h.assert_no_leak()

    def test_max_model_len_caps_the_output(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make(max_model_len=24)
        seq = h.add(make_prompt(5, 20), max_tokens=None)
        h.run()
        assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.num_tokens == 24
        assert seq.output_token_ids == h.model.reference(seq.prompt_token_ids, 4)
        h.assert_no_leak()

    def test_shared_prompts_and_salts_keep_their_own_kv(self, make: Callable[..., SchedulerHarness]) -> None:
        h = make(max_num_seqs=2)
        prompt = make_prompt(3, 21)
        seqs = [h.add(prompt, max_tokens=6, salt=salt) for salt in (None, "tenant-b", None)]
        h.run()
        seqs += [h.add([*prompt, 5, 6, 7], max_tokens=4, salt=salt) for salt in ("tenant-b", None, "tenant-c")]
        h.run()  # the simulated model fails if any sequence reads KV computed under another salt
        self.assert_reference_outputs(h, seqs)
        h.assert_no_leak()
