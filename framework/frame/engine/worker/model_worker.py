"""Worker: one model worker, i.e. one tensor-parallel rank: its platform, attention backend, model, KV pool, runner.

Every worker resolves the same plugin choices from the same EngineConfig, builds the model family's network for
its own shard of the heads and rows (the :class:`~frame.parallel.ParallelContext` set before the model is built
tells the parallel layers which), loads the weights (each layer keeps only its shard), and reports how many KV
blocks it could hold; the executor then allocates the same number on every rank. Each step it runs the plan it
receives; every rank samples the same tokens from the same gathered logits, and the driver (rank 0) reports them.
"""

from __future__ import annotations

import logging
import time

import msgspec
import torch

from frame.config import EngineConfig
from frame.engine.selection import Selection, model_options, select, select_model_family, select_quantization
from frame.engine.wire.plan import RunnerOutput, SchedulerOutput
from frame.engine.worker.attention_layers import create_layer_attention, family_specs
from frame.engine.worker.calibration import input_absmax, token_chunks
from frame.engine.worker.drafting import DraftModel
from frame.engine.worker.runner import ModelRunner
from frame.interfaces.attention import AttentionBackend
from frame.interfaces.kv_groups import KVGroups
from frame.interfaces.model import CausalLM
from frame.interfaces.proposer import Proposer, ProposerContext
from frame.interfaces.quantization import QuantizationMethod
from frame.layers import attach_platform_kernels, finish_loading, weight_bytes
from frame.model_source import ModelSource
from frame.parallel import ParallelContext, parallel_context, set_parallel_context
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.weights import open_weights
from frame.weights.pages import settle_after_load

log = logging.getLogger("frame.worker")

#: Tokens per prefill of a quantization method's calibration text (fewer where the context is shorter).
CALIBRATION_CHUNK = 512


def head_counts(hf_config: object) -> tuple[int, int, int]:
    """``(query heads, KV heads, head size)`` of a transformers config (the engine core's tensor-parallel
    pre-check; the model family states the real ones per layer, :mod:`frame.engine.worker.attention_layers`)."""
    num_heads = hf_config.num_attention_heads  # type: ignore[attr-defined]
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads  # type: ignore[attr-defined]
    return num_heads, num_kv_heads, head_dim


class Worker:
    """Builds and runs the model of one rank. ``max_model_len`` is the engine's (already capped) context length."""

    def __init__(self, config: EngineConfig, max_model_len: int, *, parallel: ParallelContext | None = None,
                 registry: PluginRegistry | None = None, source: ModelSource | None = None,
                 selection: Selection | None = None) -> None:
        """``selection`` (the engine core's, when the worker shares its process) saves resolving it again."""
        self.config = config
        self.parallel = parallel or ParallelContext()
        self.hooks = PluginHooks(registry or PluginRegistry())
        self.selection: Selection = selection or select(config, self.hooks)
        self.source = source or ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
        self.family = select_model_family(self.hooks, self.source.architecture)
        self.quantization = select_quantization(self.hooks, config, self.source, self.selection.platform)
        self.max_model_len = max_model_len
        self.selection.platform.set_up()
        model, attention = self.load_model()
        sel = self.selection
        self.runner = ModelRunner(model, attention, sel.platform.device, sel.dtype, config.block_size,
                                  config.max_num_seqs, max_model_len, config.seed, sel.kv_dtype, self.kv_groups)
        self.runner.proposer = self.make_proposer()
        self.runner.draft_batch_limit = config.speculative_disable_by_batch_size

    @property
    def rank(self) -> int:
        return self.parallel.rank

    def load_model(self) -> tuple[CausalLM, AttentionBackend]:
        """Build this rank's shard of the model, load its weights and attach the platform's kernels.

        The family states each layer's attention (heads, scale, window, soft-cap); one backend is made per distinct
        spec, and a backend that cannot serve one is refused here, before any weight is read."""
        sel, hf = self.selection, self.source.hf_config
        options = model_options(self.hooks, self.config, self.family)
        specs = family_specs(self.hooks, self.family, hf, options)
        self.kv_groups = KVGroups.of_specs(specs, self.max_model_len)  # the engine core's cache uses the same
        layers = create_layer_attention(
            self.hooks, sel.attn, specs, world_size=self.parallel.world_size, rank=self.parallel.rank,
            dtype=sel.dtype, platform=sel.platform, options=sel.options["attention"],
        )
        attention = layers[0]  # the runner builds each step's metadata through it, for every layer
        previous = parallel_context()
        set_parallel_context(self.parallel)
        try:
            model = self.hooks.create_model(self.family, hf, sel.dtype, sel.platform.device, attention, layers,
                                            options)
            method = self.quantization
            packed_source = method.open_weights(self.source.path) if method is not None else None
            model.load_weights(packed_source or open_weights(self.source.path))
            packed = finish_loading(model, method, self.calibrate(model, attention, method))
            if method is not None:
                log.info("%s: %d linear weights kept quantized", method.name, packed)
        finally:
            # The layers keep the context they were built with; the process-wide one goes back for the next
            # worker built in this process (tests build several).
            set_parallel_context(previous)
        model.eval()
        attach_platform_kernels(model, sel.platform)
        settle_after_load(self.source.path)
        return model, attention

    def calibrate(self, model: CausalLM, attention: AttentionBackend,
                  method: QuantizationMethod | None) -> dict[str, torch.Tensor] | None:
        """The dense model's largest ``|x|`` per input feature of each linear over the method's calibration text,
        or None when the method does not calibrate."""
        text = method.calibration_text() if method is not None else None
        if text is None:
            return None
        tokens = self.source.tokenizer(text).input_ids
        chunks = token_chunks(tokens, min(self.max_model_len, CALIBRATION_CHUNK))
        log.info("%s: calibrating on %d tokens", method.name, len(tokens))
        return input_absmax(model, attention, chunks, self.config.block_size, self.selection.dtype,
                            self.selection.platform.device)

    def make_proposer(self) -> Proposer | None:
        """The speculative-decoding proposer the config names (None without speculation)."""
        sel = self.selection
        if sel.proposer is None:
            return None
        context = ProposerContext(
            vocab_size=int(self.source.hf_config.vocab_size), max_model_len=self.max_model_len,
            max_num_seqs=self.config.max_num_seqs, world_size=self.parallel.world_size,
            load_draft_model=self._load_draft_model,
        )
        return self.hooks.create_proposer(sel.proposer, self.config.num_speculative_tokens, context,
                                          sel.options.get("proposer"))

    def _load_draft_model(self, model: str | None, num_blocks: int) -> DraftModel:
        return DraftModel(model, self.hooks, self.selection, self.max_model_len, self.config.block_size, num_blocks,
                          self.config.max_num_seqs)

    def available_kv_blocks(self) -> int:
        """KV blocks the platform's memory budget leaves for this rank's pool after the weights."""
        model = self.runner.model
        model_bytes = weight_bytes(model)
        budget = self.selection.platform.kv_cache_budget_bytes(self.config.kv_cache_fraction, model_bytes)
        return int(budget // self.runner.bytes_per_block)

    def allocate_kv(self, num_blocks: int) -> list[int]:
        """Allocate this rank's pool, then record the decode graphs where the platform and the backend allow it
        (one rank only: recording collectives is left to a later change); the batch sizes recorded."""
        wants_graphs = (self.config.cuda_graphs and self.runner.attention.supports_graphs
                        and self.parallel.world_size == 1)
        self.runner.allocate_kv(num_blocks, scratch_block=wants_graphs)
        self.selection.platform.place_kv_pool(self.runner.kv)  # type: ignore[arg-type]
        if wants_graphs and self.capture_graphs():
            return list(self.runner.graphs.sizes)  # type: ignore[union-attr]
        return []

    def capture_graphs(self) -> bool:
        """Record the decode step per batch-size bucket through the platform (False when it records none)."""
        with torch.inference_mode():
            platform = self.selection.platform
            recorded = self.runner.capture_graphs(platform.capture_graph, self.config.max_num_seqs,
                                                  platform.greedy_kernel())
        if not recorded:
            return False
        graphs = self.runner.graphs
        assert graphs is not None
        if self.config.record_graphs_at_start:
            start = time.perf_counter()
            with torch.inference_mode():
                graphs.record_all()
            log.info("recorded decode graphs for batch sizes %s in %.1f s", graphs.sizes, time.perf_counter() - start)
        else:
            log.info("decode graphs for batch sizes %s, each recorded on its first use", graphs.sizes)
        return True

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        output = self.runner.execute(plan)
        communicator = self.parallel.communicator
        if communicator is not None:
            return msgspec.structs.replace(output, comm_seconds=communicator.take_seconds())
        return output

    @property
    def dtype(self) -> torch.dtype:
        return self.selection.dtype
