"""EngineCore: the loop. ``step()`` = schedule (a plan, as data), execute it on the workers, update.

Built from an EngineConfig through the plugin registry: the plugin choices are resolved first (so a backend that
cannot run here fails before the model loads), then the executor starts the model workers (in this process, or
one process or Ray actor per tensor-parallel rank), which build the network and load weights; the pool is sized
from what every rank can hold, and the cache strategy and the scheduling policy are created over it. Clients
(offline ``LLM``, the API server, in this process or another) talk to it with protocol messages.
"""

from __future__ import annotations

import logging
import math
import weakref

from frame.config import EngineConfig, resolve_plugin_options
from frame.engine.core.executor import Executor
from frame.engine.core.executor.factory import make_executor
from frame.engine.core.scheduler import Scheduler, StepOutcome
from frame.engine.core.structured import StructuredOutputManager
from frame.engine.selection import (
    Selection,
    check_tensor_parallel_family,
    context_length,
    model_options,
    select,
    select_model_family,
)
from frame.engine.wire.plan import RunnerOutput, SchedulerOutput
from frame.engine.wire.requests import EngineOutput, EngineRequest, EngineStats, check_request
from frame.engine.worker.attention_layers import family_specs
from frame.engine.worker.model_worker import head_counts
from frame.errors import ConfigError
from frame.interfaces.grammar import GrammarBackend
from frame.interfaces.kv_groups import KVGroups
from frame.interfaces.scheduler import SchedulerLimits
from frame.model_source import ModelSource
from frame.parallel import HeadPartition
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.sequence import Sequence

log = logging.getLogger("frame.engine")


class EngineCore:
    """One model (on one or more ranks), one KV pool, one scheduler; single-threaded."""

    def __init__(self, config: EngineConfig, registry: PluginRegistry | None = None,
                 source: ModelSource | None = None) -> None:
        self.config = config
        self.registry = registry or PluginRegistry()
        self.hooks = PluginHooks(self.registry)
        self.selection: Selection = select(config, self.hooks)
        self.source = source or ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
        self.max_model_len = context_length(config, self.source)
        self.eos_token_ids = self.source.eos_token_ids
        self.kv_groups = self._kv_groups()
        self._check_tensor_parallel()
        self.executor = self._make_executor()
        # Worker processes must not outlive an engine that is dropped without shutdown() (a script's LLM).
        weakref.finalize(self, self.executor.shutdown)
        try:
            self.num_blocks = self._pool_size()
            #: The batch-size buckets the driver rank records decode steps for (empty: eager steps).
            self.decode_graphs = self.executor.allocate_kv(self.num_blocks)
        except BaseException:
            self.executor.shutdown()
            raise
        self.cache = self.hooks.create_cache(self.selection.cache, self.num_blocks, config.block_size,
                                             self.selection.options["cache"])
        self.cache.set_groups(self.kv_groups.windows)
        self.limits = SchedulerLimits(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len, enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_tokens,
            max_long_partial_prefills=config.max_long_partial_prefills,
            # Drafts are verified a step at a time: a proposer and continuous steps do not mix.
            num_continuous_decode_steps=1 if config.speculative_proposer else config.num_continuous_decode_steps,
        )
        policy = self.hooks.create_scheduler(self.selection.sched, self.limits, self.selection.options["scheduler"])
        self.structured = StructuredOutputManager(self._grammar_backend, int(self.source.hf_config.vocab_size),
                                                  config.grammar_cache_bytes)
        self.scheduler = Scheduler(self.limits, self.cache, policy, self.structured, self.eos_token_ids)
        self._stats = EngineStats(num_blocks=self.num_blocks)
        self.hooks.engine_started(config)

    def _check_tensor_parallel(self) -> None:
        """Refuse, before any worker starts, a tensor-parallel size this model's heads cannot be split over."""
        if self.config.tensor_parallel_size == 1:
            return
        check_tensor_parallel_family(self.hooks, self.config, select_model_family(self.hooks, self.source.architecture))
        num_heads, num_kv_heads, _ = head_counts(self.source.hf_config)
        try:
            HeadPartition.of(num_heads, num_kv_heads, self.config.tensor_parallel_size, 0)
        except ValueError as err:
            raise ConfigError(f"{err}.", param="tensor_parallel_size") from None

    def _kv_groups(self) -> KVGroups:
        """The model's KV groups (layers by window), as its workers lay out the pool: the cache keeps one block
        table per group and request."""
        family = select_model_family(self.hooks, self.source.architecture)
        specs = family_specs(self.hooks, family, self.source.hf_config, model_options(self.hooks, self.config, family))
        groups = KVGroups.of_specs(specs, self.max_model_len)
        if groups.num_groups > 1 or groups.windows[0] is not None:
            log.info("%s; a windowed group keeps only its window's blocks", groups.describe())
        return groups

    def _grammar_backend(self) -> GrammarBackend:
        """The grammar backend plugin, loaded the first time a request needs one."""
        name = self.config.grammar_backend
        self.registry.load("grammar", name)
        options = resolve_plugin_options("grammar", name, self.config.grammar_options,
                                         self.hooks.options_model("grammar", name))
        return self.hooks.create_grammar_backend(name, self.source.tokenizer, int(self.source.hf_config.vocab_size),
                                                 sorted(self.eos_token_ids), options)

    def _make_executor(self) -> Executor:
        if self.config.tensor_parallel_size == 1 and self.config.data_parallel_size > 1:
            from frame.engine.worker.rank import placement_rank

            rank, world = placement_rank(self.config)
            if world > 1:  # one of several cores on this host: its device, or its share of the CPU cores
                self.selection.platform.for_rank(rank, world)
        return make_executor(self.config, self.max_model_len, self.registry, self.source, self.selection)

    def _pool_size(self) -> int:
        """Blocks in the pool: ``num_kv_blocks``, else ``kv_cache_memory`` over a block's bytes, else what the
        platform's budget leaves (no more than every running sequence at full length could use: more only costs
        memory)."""
        config = self.config
        needed = self.kv_groups.blocks_per_sequence(self.max_model_len, config.block_size,
                                                    config.max_num_batched_tokens)
        bytes_per_block = self.executor.bytes_per_block
        if config.num_kv_blocks is not None:
            blocks, fix = config.num_kv_blocks, f"raise num_kv_blocks to at least {needed}"
        else:
            if config.kv_cache_memory is not None:
                blocks = config.kv_cache_memory // bytes_per_block
            else:
                blocks = min(self.executor.available_kv_blocks(), needed * config.max_num_seqs)
            fix = f"raise --kv-cache-memory to at least {_mib(needed * bytes_per_block)}"
        if blocks < needed:
            raise ConfigError(
                f"The KV pool holds {blocks} blocks of {config.block_size} tokens ({_mib(blocks * bytes_per_block)}), "
                f"fewer than one sequence of max_model_len {self.max_model_len} needs ({needed}); {fix} or lower "
                f"max_model_len.", param="num_kv_blocks" if config.num_kv_blocks is not None else "kv_cache_memory",
            )
        return int(blocks)

    @property
    def max_speculative_tokens(self) -> int:
        """How many tokens a request may ask to have drafted per step (0 without a proposer)."""
        return self.config.num_speculative_tokens if self.config.speculative_proposer else 0

    # -- requests ---------------------------------------------------------------------------------------
    def check_request(self, req: EngineRequest) -> None:
        """Raise a usage error for a request that could never run (too long for the model)."""
        check_request(req, self.max_model_len, self.max_speculative_tokens)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix (benchmarks start each run cold); False while requests hold blocks."""
        done = self.cache.reset()
        self._stats.prefix_cache_resets += int(done)
        return done

    def add_request(self, req: EngineRequest) -> None:
        """Check ``req`` and hand it to the scheduler, which owns it until it finishes (a bad constraint raises)."""
        self.check_request(req)
        self.scheduler.add_request(req)

    def abort(self, request_ids: list[str]) -> list[EngineOutput]:
        """Abort requests wherever they are; their blocks return to the pool. Unknown ids are ignored."""
        outcome = self.scheduler.abort_requests(request_ids)
        self._report_finished(outcome.finished)
        return outcome.outputs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_requests(self) -> int:
        """Requests the core holds, running or waiting."""
        return self.scheduler.num_requests

    def outstanding_tokens(self) -> int:
        """Tokens still to compute for the requests the core holds (:meth:`Scheduler.outstanding_tokens`)."""
        return self.scheduler.outstanding_tokens()

    # -- the loop ---------------------------------------------------------------------------------------
    def step(self) -> list[EngineOutput]:
        """Run one step and return the new tokens of every request that produced any, and of finished ones."""
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        result = self.executor.execute(plan)
        outcome = self.scheduler.update(plan, result)
        self._count(plan, result, outcome)
        self._report_finished(outcome.finished)
        return outcome.outputs

    def _count(self, plan: SchedulerOutput, result: RunnerOutput, outcome: StepOutcome) -> None:
        stats = self._stats
        stats.steps += 1
        stats.spec_draft_tokens += outcome.num_draft_tokens
        stats.spec_accepted_tokens += outcome.num_accepted_tokens
        stats.spec_verifications += sum(1 for r in plan.running if r.spec_token_ids)
        stats.comm_seconds += result.comm_seconds
        stats.prompt_tokens_computed += plan.num_prompt_tokens
        stats.generation_tokens += sum(len(o.new_token_ids) for o in outcome.outputs)

    def _report_finished(self, finished: list[Sequence]) -> None:
        for seq in finished:
            self.hooks.request_finished(seq.seq_id, seq.num_prompt_tokens, seq.num_output_tokens,
                                        seq.num_cached_tokens, seq.status.value)

    def stats(self) -> EngineStats:
        s, c = self._stats, self.cache.stats
        s.num_running, s.num_waiting = self.scheduler.num_running, self.scheduler.num_waiting
        s.kv_usage, s.blocks_in_use, s.peak_blocks_in_use = c.usage, c.blocks_in_use, c.peak_blocks_in_use
        s.prefix_queries, s.prefix_query_tokens, s.prefix_hit_tokens = c.queries, c.query_tokens, c.hit_tokens
        s.evictions = c.evictions
        s.kv_groups = ["full" if w is None else f"window {w}" for w in self.kv_groups.windows]
        s.group_blocks_in_use = list(c.group_blocks_in_use)
        s.peak_group_blocks_in_use = list(c.peak_group_blocks_in_use)
        s.preemptions = self.scheduler.num_preemptions
        grammars = self.structured.cache
        s.grammar_cache_entries, s.grammar_cache_bytes = len(grammars), grammars.bytes
        s.grammar_cache_evictions, s.grammar_compile_seconds = grammars.evictions, grammars.compile_seconds
        return s

    def shutdown(self) -> None:
        """Stop the model workers (worker processes or actors); the core cannot step afterwards."""
        self.executor.shutdown()


def _mib(size: int) -> str:
    """``size`` bytes as ``--kv-cache-memory`` spells a size (``12.5MiB``)."""
    return f"{math.ceil(size / (1 << 20) * 10) / 10:g}MiB"
