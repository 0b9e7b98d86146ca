"""The plugin kinds: entry-point group, hookspec module, the hook every plugin of the kind must answer."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

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
    """One kind of plugin: its entry-point ``group``, its hookspecs, its contract and how users select one.

    This table is the one list of the kinds: ``frame new-plugin`` and ``frame plugins`` read it, the kinds section
    of docs/plugins.md is :func:`markdown_table` of it, and tests/test_kinds_docs.py fails when another list of the
    kinds in the docs (docs/architecture.md, README.md, the ``frame_plugin_options`` docstring) disagrees with it.

    ``flag`` is the engine flag that selects a plugin of the kind (``--<flag>``), or None for model families,
    which the checkpoint's architectures select. ``probes`` are the kind's argument-free hooks that the core asks
    every installed plugin of the kind (``frame plugins``, ``auto`` choices, architecture lookup): they are asked
    first when the plugin loads, and a plugin that raises in one is marked broken (unable to run, never fatal).
    ``options_key`` is the config section of the selected plugin's own options (``frame_plugin_options``);
    ``scope`` says which command's setting selects the kind: ``engine`` (the engine config: ``frame generate``,
    ``frame serve``, ``LLM``), ``serve`` (the API server only) or ``bench`` (``frame bench`` and experiment files:
    a workload is selected by its own name and sized by its parameters, not an options model).
    ``deprecated_hooks`` are older names of ``required_hook`` that still count as it.
    """

    name: str
    flag: str | None
    group: str
    plural: str
    specs: ModuleType
    required_hook: str
    probes: tuple[str, ...] = ()
    #: What the kind is, in a few words, singular ("KV cache"): docs tables and README rows use it.
    title: str = ""
    #: The module of the kind's abstract base and result types, and the base a plugin's object subclasses.
    interface: str = ""
    base: str = ""
    #: The conformance suite a plugin of the kind subclasses in its tests, ``module:Class``.
    suite: str = ""
    options_key: str = ""
    scope: str = "engine"
    #: The flag of the options when it is not derived from ``options_key`` (a workload's ``--workload-opt``).
    options_cli: str = ""
    deprecated_hooks: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        """The config key that selects a plugin of this kind (what a usage error names)."""
        return (self.flag or "model").replace("-", "_")

    @property
    def options_flag(self) -> str:
        """The command-line spelling of the options section: ``--cache-opt KEY=VALUE``."""
        return self.options_cli or "--" + self.options_key.removesuffix("_options").replace("_", "-") + "-opt"

    @property
    def engine_config(self) -> bool:
        """Whether the kind's selection and options are engine config keys (``frame.config.OPTION_SECTIONS``)."""
        return self.scope != "bench"

    @property
    def how_to_choose(self) -> str:
        """How a user picks a plugin of this kind, for the end of an error message."""
        if self.scope == "bench":
            return f"frame bench --{self.flag} picks one of their workloads by name"
        return f"--{self.flag}" if self.flag else "chosen by the checkpoint's architectures"


def _kind(name: str, title: str, flag: str | None, group: str, plural: str, specs: ModuleType, base: str,
          suite: str, options_key: str, probes: tuple[str, ...] = (), scope: str = "engine",
          verb: str = "create", **more: Any) -> PluginKind:
    return PluginKind(name, flag, group, plural, specs, f"frame_{name}_{verb}", probes, title,
                      f"frame.interfaces.{name}", base, suite, options_key, scope, **more)


KINDS: dict[str, PluginKind] = {
    k.name: k
    for k in (
        _kind("platform", "platform", "platform", "frame.platforms", "platforms", platform, "Platform",
              "frame.testing.platform:PlatformSuite", "platform_options",
              ("frame_platform_check", "frame_platform_priority")),
        _kind("attention", "attention backend", "attn", "frame.attention", "attention", attention,
              "AttentionBackend", "frame.testing.attention:AttentionBackendSuite", "attn_options",
              ("frame_attention_platforms", "frame_attention_kv_dtypes")),
        _kind("cache", "KV cache", "cache", "frame.caches", "caches", cache, "KVCacheStrategy",
              "frame.testing.cache:CacheConformance", "cache_options"),
        _kind("scheduler", "scheduler", "sched", "frame.schedulers", "schedulers", scheduler, "SchedulingPolicy",
              "frame.testing.scheduler:SchedulerConformance", "sched_options"),
        _kind("model", "model family", None, "frame.models", "models", model, "CausalLM",
              "frame.testing.model:ModelFamilySuite", "model_options",
              ("frame_model_architectures", "frame_model_fallback")),
        _kind("proposer", "speculative proposer", "speculative-proposer", "frame.proposers", "proposers", proposer,
              "Proposer", "frame.testing.proposer:ProposerConformance", "speculative_options"),
        _kind("grammar", "grammar backend", "grammar-backend", "frame.grammars", "grammars", grammar,
              "GrammarBackend", "frame.testing.grammar:GrammarConformance", "grammar_options"),
        _kind("tool_parser", "tool-call parser", "tool-parser", "frame.tool_parsers", "tool parsers", tool_parser,
              "ToolParser", "frame.testing.tool_parser:ToolParserConformance", "tool_parser_options", scope="serve"),
        _kind("router", "data-parallel router", "router", "frame.routers", "routers", router, "Router",
              "frame.testing.router:RouterConformance", "router_options"),
        _kind("quantization", "quantization method", "quantization", "frame.quantization", "quantization methods",
              quantization, "QuantizationMethod", "frame.testing.quantization:QuantizationConformance",
              "quantization_options"),
        _kind("workload", "benchmark workload", "workload", "frame.workloads", "workloads", workload, "Workload",
              "frame.testing.workload:WorkloadConformance", "params", scope="bench", verb="list",
              options_cli="--workload-opt", deprecated_hooks=("frame_workloads",)),
    )
}

#: Hookspec modules that are not tied to one kind.
SHARED_SPECS: tuple[ModuleType, ...] = (common, lifecycle)


def hooks_of(kind: PluginKind) -> list[str]:
    """The hooks a plugin of ``kind`` may implement (its hookspec module's), in source order."""
    return [name for name in vars(kind.specs) if name.startswith("frame_")]


def markdown_table() -> str:
    """The kinds as the Markdown table in docs/plugins.md ("The kinds"), one row per kind."""
    rows = ["| kind | entry-point group | selected by | options (config key, flag) | interface | conformance suite "
            "| probing hooks |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for k in KINDS.values():
        only = {"engine": "", "serve": ", serve only", "bench": ", bench only: a workload's name"}[k.scope]
        selected = f"`--{k.flag}` (`{k.param}`{only})" if k.flag else "the checkpoint's `architectures`"
        probes = ", ".join(f"`{p}`" for p in k.probes) or "none"
        rows.append(f"| `{k.name}` ({k.title}) | `{k.group}` | {selected} | `{k.options_key}`, `{k.options_flag}` "
                    f"| `{k.interface}.{k.base}` | `{k.suite.replace(':', '.')}` | {probes} |")
    return "\n".join(rows) + "\n"
