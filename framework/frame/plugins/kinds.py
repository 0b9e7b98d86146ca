"""The plugin kinds: entry-point group, hookspec module, the hook every plugin of the kind must answer."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from frame.hookspecs import (
    attention,
    cache,
    common,
    grammar,
    lifecycle,
    model,
    platform,
    proposer,
    quantization,
    router,
    scheduler,
    tool_parser,
    workload,
)


@dataclass(frozen=True)
class PluginKind:
    """One kind of plugin: its entry-point ``group``, its hookspecs and how users select one.

    ``flag`` is the engine flag that selects a plugin of the kind (``--<flag>``), or None for model families,
    which the checkpoint's architectures select. ``probes`` are the kind's argument-free hooks that the core asks
    every installed plugin of the kind (``frame plugins``, ``auto`` choices, architecture lookup): they are asked
    first when the plugin loads, and a plugin that raises in one is marked broken (unable to run, never fatal).
    """

    name: str
    flag: str | None
    group: str
    plural: str
    specs: ModuleType
    required_hook: str
    probes: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        """The config key that selects a plugin of this kind (what a usage error names)."""
        return (self.flag or "model").replace("-", "_")

    @property
    def how_to_choose(self) -> str:
        """How a user picks a plugin of this kind, for the end of an error message."""
        return f"--{self.flag}" if self.flag else "chosen by the checkpoint's architectures"


KINDS: dict[str, PluginKind] = {
    k.name: k
    for k in (
        PluginKind("platform", "platform", "frame.platforms", "platforms", platform, "frame_platform_create",
                   ("frame_platform_check", "frame_platform_priority")),
        PluginKind("attention", "attn", "frame.attention", "attention", attention, "frame_attention_create",
                   ("frame_attention_platforms",)),
        PluginKind("cache", "cache", "frame.caches", "caches", cache, "frame_cache_create"),
        PluginKind("scheduler", "sched", "frame.schedulers", "schedulers", scheduler, "frame_scheduler_create"),
        PluginKind("model", None, "frame.models", "models", model, "frame_model_create",
                   ("frame_model_architectures", "frame_model_fallback")),
        PluginKind("proposer", "speculative-proposer", "frame.proposers", "proposers", proposer,
                   "frame_proposer_create"),
        PluginKind("grammar", "grammar-backend", "frame.grammars", "grammars", grammar, "frame_grammar_create"),
        PluginKind("tool_parser", "tool-parser", "frame.tool_parsers", "tool parsers", tool_parser,
                   "frame_tool_parser_create"),
        PluginKind("router", "router", "frame.routers", "routers", router, "frame_router_create"),
        PluginKind("quantization", "quantization", "frame.quantization", "quantization methods", quantization,
                   "frame_quantization_create"),
    )
}

#: Hookspec modules that are not tied to one kind.
SHARED_SPECS: tuple[ModuleType, ...] = (common, lifecycle, workload)
