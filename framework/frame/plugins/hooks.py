"""PluginHooks: the one typed facade through which the core calls plugin hooks.

Kind hooks are called on one named plugin (the one selected), so several plugins of a kind can be loaded at
once (``frame plugins``, auto-selection) without answering each other's calls. Every call is isolated:

- a kind's probing hooks (platform check and priority, attention platforms, model architectures) are asked
  through the registry, which also asks them once at load: a plugin that raises in one is marked broken, so
  ``load_all`` and everything built on it (auto choices, ``frame plugins``) pass over it, and asked by name it is
  one sentence naming its wheel and the hook;
- ``frame_attention_check`` (it needs the platform, so it is asked here) turns an exception into the reason the
  backend cannot run, naming the hook and where the plugin comes from;
- broadcast hooks (lifecycle, workload lists) call each implementer on its own: one that raises is logged once and
  left out, the others carry on.

A selected plugin's own hooks (options, create) raise as they are: their errors are the plugin's contract (a
backend refuses heads that do not group with ValueError, and the conformance suites check that). With
``FRAME_TRACE_HOOKS=1`` the traceback of an isolated hook that raised is printed to stderr too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from frame.errors import FrameUsageError, IncompatiblePluginError
from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.grammar import GrammarBackend
from frame.interfaces.proposer import Proposer, ProposerContext
from frame.interfaces.router import Router
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from frame.interfaces.tool_parser import ToolParser
from frame.plugins.calls import call_one, describe, implementers
from frame.plugins.kinds import KINDS
from frame.plugins.registry import PluginRegistry

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

    from frame.interfaces.attention import AttentionBackend, AttentionSpec
    from frame.interfaces.model import CausalLM
    from frame.interfaces.platform import Platform
    from frame.interfaces.quantization import QuantizationMethod
    from frame.interfaces.workload import Workload

log = logging.getLogger("frame.plugins")

_MISSING = object()


class PluginHooks:
    """Typed calls into loaded plugins. Loads a plugin on first use."""

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry
        self._warned: set[tuple[str, str]] = set()

    def _call(self, kind: str, name: str, hook: str, default: Any = _MISSING, **kwargs: Any) -> Any:
        self.registry.load(kind, name)
        results = call_one(self.registry.pm, f"{kind}:{name}", hook, **kwargs)
        if results:
            return results[0]
        if default is not _MISSING:
            return default
        raise IncompatiblePluginError(f"The {kind} plugin '{name}' returned nothing from {hook}.",
                                      param=KINDS[kind].param)

    def _probe(self, kind: str, name: str, hook: str, default: Any) -> Any:
        answer = self.registry.probe(kind, name, hook)
        return default if answer is None else answer

    def _broadcast(self, hook: str, **kwargs: Any) -> list[Any]:
        """Every implementer's answer, first registered first; one that raises is logged (once) and skipped."""
        return [answer for _, answer in self._answers(hook, **kwargs)]

    def _answers(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``(plugin, answer)`` of every implementer, as :meth:`_broadcast` isolates them."""
        answers = []
        for plugin_name in implementers(self.registry.pm, hook):
            try:
                answers.extend((plugin_name, a) for a in call_one(self.registry.pm, plugin_name, hook, **kwargs))
            except Exception as err:
                self._trace(err, f"{plugin_name} {hook}")
                if (plugin_name, hook) not in self._warned:
                    self._warned.add((plugin_name, hook))
                    log.warning("The plugin '%s' raised in %s (%s); frame carries on without its answer.",
                                plugin_name, hook, describe(err))
        return answers

    def _trace(self, err: BaseException, where: str) -> None:
        self.registry.trace_raised(err, where)

    # -- every kind -------------------------------------------------------------------------------------
    def options_model(self, kind: str, name: str) -> type[BaseModel] | None:
        return self._call(kind, name, "frame_plugin_options", default=None)

    # -- platform ---------------------------------------------------------------------------------------
    def platform_check(self, name: str) -> str | None:
        return self._probe("platform", name, "frame_platform_check", None)

    def platform_priority(self, name: str) -> int:
        return self._probe("platform", name, "frame_platform_priority", 0)

    def create_platform(self, name: str, options: BaseModel | None) -> Platform:
        return self._call("platform", name, "frame_platform_create", options=options)

    # -- attention --------------------------------------------------------------------------------------
    def attention_platforms(self, name: str) -> list[str]:
        return list(self._probe("attention", name, "frame_attention_platforms", []))

    def attention_check(self, name: str, platform: Platform) -> str | None:
        """None when the backend can run on ``platform``; otherwise why not (also when its check raised)."""
        try:
            return self._call("attention", name, "frame_attention_check", default=None, platform=platform)
        except FrameUsageError:
            raise
        except Exception as err:
            self._trace(err, f"attention:{name} frame_attention_check")
            origin = self.registry.info("attention", name).origin
            return f"cannot run here: its frame_attention_check raised {describe(err)} ({origin})"

    def attention_kv_dtypes(self, name: str) -> list[str]:
        """The KV dtypes the backend declares (:data:`~frame.interfaces.kv_dtype.FLOAT_KV_DTYPES` when it declares
        none)."""
        from frame.interfaces.kv_dtype import FLOAT_KV_DTYPES  # torch: never imported on the API process's side

        return list(self._probe("attention", name, "frame_attention_kv_dtypes", FLOAT_KV_DTYPES))

    def create_attention(
        self, name: str, *, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, dtype: torch.dtype,
        platform: Platform, options: BaseModel | None, sliding_window: int | None = None,
        logit_softcap: float | None = None,
    ) -> AttentionBackend:
        return self._call(
            "attention", name, "frame_attention_create", num_heads=num_heads, num_kv_heads=num_kv_heads,
            head_dim=head_dim, scale=scale, dtype=dtype, platform=platform, options=options,
            sliding_window=sliding_window, logit_softcap=logit_softcap,
        )

    # -- cache and scheduler ----------------------------------------------------------------------------
    def create_cache(self, name: str, num_blocks: int, block_size: int, options: BaseModel | None) -> KVCacheStrategy:
        return self._call("cache", name, "frame_cache_create", num_blocks=num_blocks, block_size=block_size,
                          options=options)

    def create_scheduler(self, name: str, limits: SchedulerLimits, options: BaseModel | None) -> SchedulingPolicy:
        return self._call("scheduler", name, "frame_scheduler_create", limits=limits, options=options)

    # -- speculative decoding ---------------------------------------------------------------------------
    def create_proposer(self, name: str, num_speculative_tokens: int, context: ProposerContext,
                        options: BaseModel | None) -> Proposer:
        return self._call("proposer", name, "frame_proposer_create", num_speculative_tokens=num_speculative_tokens,
                          context=context, options=options)

    # -- structured outputs -----------------------------------------------------------------------------
    def create_grammar_backend(self, name: str, tokenizer: Any, vocab_size: int, stop_token_ids: list[int],
                               options: BaseModel | None) -> GrammarBackend:
        return self._call("grammar", name, "frame_grammar_create", tokenizer=tokenizer, vocab_size=vocab_size,
                          stop_token_ids=stop_token_ids, options=options)

    def create_tool_parser(self, name: str, options: BaseModel | None) -> ToolParser:
        return self._call("tool_parser", name, "frame_tool_parser_create", options=options)

    # -- data parallelism -------------------------------------------------------------------------------
    def create_router(self, name: str, num_ranks: int, block_size: int, options: BaseModel | None) -> Router:
        return self._call("router", name, "frame_router_create", num_ranks=num_ranks, block_size=block_size,
                          options=options)

    # -- quantization -----------------------------------------------------------------------------------
    def create_quantization(self, name: str, options: BaseModel | None) -> QuantizationMethod:
        method = self._call("quantization", name, "frame_quantization_create", options=options)
        method.name = name
        return method

    # -- model ------------------------------------------------------------------------------------------
    def model_architectures(self, name: str) -> list[str]:
        return list(self._probe("model", name, "frame_model_architectures", []))

    def model_is_fallback(self, name: str) -> bool:
        return bool(self._probe("model", name, "frame_model_fallback", False))

    def model_attention(self, name: str, hf_config: PretrainedConfig,
                        options: BaseModel | None) -> list[AttentionSpec] | None:
        """The family's per-layer attention, or None when it does not state it (API 2 families before issue 18)."""
        return self._call("model", name, "frame_model_attention", default=None, hf_config=hf_config,
                          options=options)

    def create_model(
        self, name: str, hf_config: PretrainedConfig, dtype: torch.dtype, device: torch.device,
        attention: AttentionBackend, layer_attention: list[AttentionBackend] | None = None,
        options: BaseModel | None = None,
    ) -> CausalLM:
        return self._call("model", name, "frame_model_create", hf_config=hf_config, dtype=dtype, device=device,
                          attention=attention, layer_attention=layer_attention, options=options)

    # -- lifecycle (broadcast) --------------------------------------------------------------------------
    def engine_started(self, config: Any) -> None:
        self._broadcast("frame_engine_started", config=config)

    def request_finished(self, seq_id: str, num_prompt_tokens: int, num_output_tokens: int,
                         num_cached_tokens: int, finish_reason: str) -> None:
        self._broadcast(
            "frame_request_finished", seq_id=seq_id, num_prompt_tokens=num_prompt_tokens,
            num_output_tokens=num_output_tokens, num_cached_tokens=num_cached_tokens, finish_reason=finish_reason,
        )

    # -- workloads (broadcast) --------------------------------------------------------------------------
    def workload_list(self, name: str) -> list[Workload]:
        """The workloads one workload plugin offers (through the deprecated ``frame_workloads`` when it has only
        that)."""
        self.registry.load("workload", name)
        hook = "frame_workload_list"
        if f"workload:{name}" not in implementers(self.registry.pm, hook):
            hook = "frame_workloads"
        return list(self._call("workload", name, hook, default=[]))

    def workloads(self) -> list[tuple[str, Any]]:
        """``(plugin, answer)`` for every registered plugin's ``frame_workload_list`` (first registered first), then
        for the plugins that implement only the deprecated ``frame_workloads``; the catalog checks the answers."""
        current = set(implementers(self.registry.pm, "frame_workload_list"))
        return [*self._answers("frame_workload_list"),
                *((p, a) for p, a in self._answers("frame_workloads") if p not in current)]
