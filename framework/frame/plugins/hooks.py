"""PluginHooks: the one typed facade through which the core calls plugin hooks.

Kind hooks are called on one named plugin (the one selected), so several plugins of a kind can be loaded at
once (``frame plugins``, auto-selection) without answering each other's calls. Lifecycle hooks are broadcast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel
from transformers import PretrainedConfig

from frame.errors import IncompatiblePluginError
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.model import CausalLM
from frame.interfaces.platform import Platform
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from frame.plugins.registry import PluginRegistry

if TYPE_CHECKING:
    from frame.workloads.base import Workload

_MISSING = object()


class PluginHooks:
    """Typed calls into loaded plugins. Loads a plugin on first use."""

    def __init__(self, registry: PluginRegistry) -> None:
        self.registry = registry

    def _call(self, kind: str, name: str, hook: str, default: Any = _MISSING, **kwargs: Any) -> Any:
        self.registry.load(kind, name)
        pm = self.registry.pm
        target = f"{kind}:{name}"
        # Call through pluggy (so tracing and argument handling apply), restricted to the one plugin asked.
        others = [plugin for plugin_name, plugin in pm.list_name_plugin() if plugin_name != target]
        results = pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)
        if results:
            return results[0]
        if default is not _MISSING:
            return default
        raise IncompatiblePluginError(f"The {kind} plugin '{name}' returned nothing from {hook}.")

    # -- every kind -------------------------------------------------------------------------------------
    def options_model(self, kind: str, name: str) -> type[BaseModel] | None:
        return self._call(kind, name, "frame_plugin_options", default=None)

    # -- platform ---------------------------------------------------------------------------------------
    def platform_check(self, name: str) -> str | None:
        return self._call("platform", name, "frame_platform_check", default=None)

    def platform_priority(self, name: str) -> int:
        return self._call("platform", name, "frame_platform_priority", default=0)

    def create_platform(self, name: str, options: BaseModel | None) -> Platform:
        return self._call("platform", name, "frame_platform_create", options=options)

    # -- attention --------------------------------------------------------------------------------------
    def attention_platforms(self, name: str) -> list[str]:
        return list(self._call("attention", name, "frame_attention_platforms", default=[]))

    def attention_check(self, name: str, platform: Platform) -> str | None:
        return self._call("attention", name, "frame_attention_check", default=None, platform=platform)

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

    # -- model ------------------------------------------------------------------------------------------
    def model_architectures(self, name: str) -> list[str]:
        return list(self._call("model", name, "frame_model_architectures", default=[]))

    def model_is_fallback(self, name: str) -> bool:
        return bool(self._call("model", name, "frame_model_fallback", default=False))

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
        self.registry.pm.hook.frame_engine_started(config=config)

    def request_finished(self, seq_id: str, num_prompt_tokens: int, num_output_tokens: int,
                         num_cached_tokens: int, finish_reason: str) -> None:
        self.registry.pm.hook.frame_request_finished(
            seq_id=seq_id, num_prompt_tokens=num_prompt_tokens, num_output_tokens=num_output_tokens,
            num_cached_tokens=num_cached_tokens, finish_reason=finish_reason,
        )

    # -- workloads (broadcast) --------------------------------------------------------------------------
    def workloads(self) -> list[Workload]:
        """Every registered plugin's ``frame_workloads`` answer, concatenated (first registered first)."""
        return [w for answer in reversed(self.registry.pm.hook.frame_workloads()) for w in answer]
