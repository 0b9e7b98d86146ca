"""The plugin kinds: entry-point group, hookspec module, the hook every plugin of the kind must answer."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from frame.hookspecs import attention, cache, common, lifecycle, model, platform, proposer, scheduler, workload


@dataclass(frozen=True)
class PluginKind:
    """One kind of plugin: ``name`` as in ``--<flag>``, its entry-point ``group`` and its hookspecs."""

    name: str
    flag: str
    group: str
    plural: str
    specs: ModuleType
    required_hook: str


KINDS: dict[str, PluginKind] = {
    k.name: k
    for k in (
        PluginKind("platform", "platform", "frame.platforms", "platforms", platform, "frame_platform_create"),
        PluginKind("attention", "attn", "frame.attention", "attention", attention, "frame_attention_create"),
        PluginKind("cache", "cache", "frame.caches", "caches", cache, "frame_cache_create"),
        PluginKind("scheduler", "sched", "frame.schedulers", "schedulers", scheduler, "frame_scheduler_create"),
        PluginKind("model", "model-family", "frame.models", "models", model, "frame_model_create"),
        PluginKind("proposer", "speculative-proposer", "frame.proposers", "proposers", proposer,
                   "frame_proposer_create"),
    )
}

#: Hookspec modules that are not tied to one kind.
SHARED_SPECS: tuple[ModuleType, ...] = (common, lifecycle, workload)
