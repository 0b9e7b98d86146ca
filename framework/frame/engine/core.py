"""EngineCore: the loop. ``step()`` = schedule, run one flat batch, sample, update.

Built from an EngineConfig through the plugin registry: the platform and attention backend are resolved first
(so a backend that cannot run here fails before the model loads), then the model family builds the network and
loads weights, the runner sizes and allocates the KV pool, and the cache strategy and scheduler are created over
it. Clients (offline ``LLM``, the API server, in this process or another) talk to it with protocol messages.
"""

from __future__ import annotations

import logging
import math

from frame.config import EngineConfig
from frame.engine.protocol import EngineOutput, EngineRequest, EngineStats, TokenLogprobs
from frame.engine.runner import ModelRunner
from frame.engine.selection import Selection, select, select_model_family
from frame.errors import ConfigError, PromptTooLongError
from frame.interfaces.scheduler import SchedulerLimits, StepResult
from frame.layers import attach_platform_kernels
from frame.model_source import ModelSource
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.sequence import Sequence
from frame.weights import open_weights

log = logging.getLogger("frame.engine")


class EngineCore:
    """One model, one KV pool, one scheduler; single-threaded."""

    def __init__(self, config: EngineConfig, registry: PluginRegistry | None = None,
                 source: ModelSource | None = None) -> None:
        self.config = config
        self.hooks = PluginHooks(registry or PluginRegistry())
        self.selection: Selection = select(config, self.hooks)
        self.source = source or ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
        family = select_model_family(self.hooks, self.source.architecture)
        self.max_model_len = min(config.max_model_len or self.source.max_position_embeddings,
                                 self.source.max_position_embeddings)
        self.eos_token_ids = self.source.eos_token_ids
        self.runner = self._build_runner(family)
        self.num_blocks = self._pool_size()
        self.runner.allocate_kv(self.num_blocks)
        self.cache = self.hooks.create_cache(self.selection.cache, self.num_blocks, config.block_size,
                                             self.selection.options["cache"])
        self.limits = SchedulerLimits(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len, enable_chunked_prefill=config.enable_chunked_prefill,
        )
        self.scheduler = self.hooks.create_scheduler(self.selection.sched, self.limits, self.cache,
                                                     self.selection.options["scheduler"])
        self._seqs: dict[str, Sequence] = {}
        self._stats = EngineStats(num_blocks=self.num_blocks)
        self.hooks.engine_started(config)

    def _build_runner(self, family: str) -> ModelRunner:
        sel, hf = self.selection, self.source.hf_config
        sel.platform.set_up()
        num_heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // num_heads
        attention = self.hooks.create_attention(
            sel.attn, num_heads=num_heads, num_kv_heads=getattr(hf, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim, scale=head_dim**-0.5, dtype=sel.dtype, platform=sel.platform,
            options=sel.options["attention"],
        )
        model = self.hooks.create_model(family, hf, sel.dtype, sel.platform.device, attention)
        model.load_weights(open_weights(self.source.path))
        model.eval()
        attach_platform_kernels(model, sel.platform)
        return ModelRunner(model, attention, sel.platform.device, sel.dtype, self.config.block_size,
                           self.config.seed)

    def _pool_size(self) -> int:
        needed = math.ceil(self.max_model_len / self.config.block_size)
        if self.config.num_kv_blocks is not None:
            blocks = self.config.num_kv_blocks
        else:
            model_bytes = sum(p.numel() * p.element_size() for p in self.runner.model.parameters())
            budget = self.selection.platform.kv_cache_budget_bytes(self.config.kv_cache_fraction, model_bytes)
            blocks = budget // self.runner.bytes_per_block
            # More blocks than every running sequence at full length could use only costs memory.
            blocks = min(blocks, needed * self.config.max_num_seqs)
        if blocks < needed:
            raise ConfigError(
                f"The KV pool holds {blocks} blocks of {self.config.block_size} tokens, fewer than one sequence of "
                f"max_model_len {self.max_model_len} needs ({needed}); raise num_kv_blocks or lower max_model_len.",
                param="num_kv_blocks",
            )
        return int(blocks)

    # -- requests ---------------------------------------------------------------------------------------
    def check_request(self, req: EngineRequest) -> None:
        """Raise a usage error for a request that could never run (too long for the model)."""
        n = len(req.prompt_token_ids)
        if n == 0:
            raise PromptTooLongError("The prompt is empty; send at least one token.", param="prompt")
        max_tokens = req.params.max_tokens or 1
        if n + max_tokens > self.max_model_len:
            raise PromptTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens, but the prompt has {n} tokens "
                f"and max_tokens asks for {max_tokens} more; shorten the prompt or lower max_tokens.",
                param="max_tokens" if n < self.max_model_len else "prompt",
            )

    def add_request(self, req: EngineRequest) -> None:
        self.check_request(req)
        if req.request_id in self._seqs:
            raise ValueError(f"request id {req.request_id} is already running")
        seq = Sequence(
            seq_id=req.request_id, prompt_token_ids=list(req.prompt_token_ids), params=req.params,
            arrival_time=req.arrival_time, priority=req.priority, cache_salt=req.cache_salt,
            eos_token_ids=self.eos_token_ids,
        )
        self._seqs[seq.seq_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_ids: list[str]) -> list[EngineOutput]:
        """Abort sequences wherever they are; their blocks return to the pool. Unknown ids are ignored."""
        outputs = []
        for rid in request_ids:
            seq = self.scheduler.abort(rid)
            if seq is not None:
                outputs.append(self._finish(seq, []))
        return outputs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop ---------------------------------------------------------------------------------------
    def step(self) -> list[EngineOutput]:
        """Run one step and return the new tokens of every sequence that produced any, and of finished ones."""
        out = self.scheduler.schedule()
        if out.is_empty:
            return []
        results = self.runner.execute(out, self.cache)
        finished = {s.seq_id for s in self.scheduler.update(out, results)}
        self._stats.steps += 1
        self._stats.prompt_tokens_computed += sum(
            min(i.num_new_tokens, max(0, i.seq.num_prompt_tokens - (i.seq.num_computed_tokens - i.num_new_tokens)))
            for i in out.scheduled
        )
        self._stats.generation_tokens += len(results)
        outputs = []
        for seq_id, result in results.items():
            seq = self._seqs[seq_id]
            if seq_id in finished:
                outputs.append(self._finish(seq, [result]))
            else:
                outputs.append(self._output(seq, [result]))
        return outputs

    def _output(self, seq: Sequence, results: list[StepResult], finish: str | None = None) -> EngineOutput:
        logprobs = None
        if seq.params.logprobs is not None:
            logprobs = [TokenLogprobs(r.token_id, r.logprob or 0.0, list(r.top_logprobs)) for r in results]
        return EngineOutput(
            request_id=seq.seq_id, new_token_ids=[r.token_id for r in results], new_logprobs=logprobs,
            finish_reason=finish, stop_reason=seq.stop_reason if isinstance(seq.stop_reason, int) else None,
            num_prompt_tokens=seq.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
        )

    def _finish(self, seq: Sequence, results: list[StepResult]) -> EngineOutput:
        self._seqs.pop(seq.seq_id, None)
        self.runner.sampler.forget(seq.seq_id)
        reason = seq.status.value
        self.hooks.request_finished(seq.seq_id, seq.num_prompt_tokens, seq.num_output_tokens,
                                    seq.num_cached_tokens, reason)
        return self._output(seq, results, finish=reason)

    def stats(self) -> EngineStats:
        s, c = self._stats, self.cache.stats
        s.num_running, s.num_waiting = self.scheduler.num_running, self.scheduler.num_waiting
        s.kv_usage, s.blocks_in_use, s.peak_blocks_in_use = c.usage, c.blocks_in_use, c.peak_blocks_in_use
        s.prefix_queries, s.prefix_query_tokens, s.prefix_hit_tokens = c.queries, c.query_tokens, c.hit_tokens
        s.evictions = c.evictions
        s.preemptions = getattr(self.scheduler, "num_preemptions", 0)
        return s
