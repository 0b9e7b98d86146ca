"""Resolve the engine config's plugin choices before anything heavy loads.

``auto`` platforms and backends are chosen here; a backend that cannot run on the chosen platform, an unknown
name or a bad plugin option fails here with one sentence, before the model is read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel

from frame.config import OPTION_SECTIONS, EngineConfig, resolve_plugin_options
from frame.errors import ConfigError, PluginUnavailableError, UnknownPluginError
from frame.interfaces.kv_dtype import resolve_kv_dtype
from frame.interfaces.platform import Platform
from frame.interfaces.quantization import QuantizationMethod
from frame.plugins.families import family_for
from frame.plugins.hooks import PluginHooks

if TYPE_CHECKING:  # transformers is heavy: the source is opened only once the choices are checked
    from frame.model_source import ModelSource

log = logging.getLogger("frame.selection")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Selection:
    """The plugins and options one engine runs with."""

    platform: Platform
    platform_name: str
    attn: str
    cache: str
    sched: str
    dtype: torch.dtype
    options: dict[str, BaseModel | None]
    proposer: str | None = None
    #: The KV pool's dtype (``--kv-cache-dtype``, ``auto`` resolved to ``dtype``); None: ``dtype``.
    kv_dtype: torch.dtype | None = None


def _options(hooks: PluginHooks, config: EngineConfig, kind: str, name: str) -> BaseModel | None:
    values = getattr(config, OPTION_SECTIONS[kind])
    return resolve_plugin_options(kind, name, values, hooks.options_model(kind, name))


def select_platform(hooks: PluginHooks, name: str) -> str:
    """The platform to run on: ``name``, checked, or for ``auto`` the highest-priority platform that can run."""
    registry = hooks.registry
    if name != "auto":
        registry.load("platform", name)
        reason = hooks.platform_check(name)
        if reason is not None:
            usable = [n for n in registry.load_all("platform") if hooks.platform_check(n) is None]
            raise PluginUnavailableError(
                f"The platform '{name}' cannot run here: {reason.rstrip('.')}; platforms that can: "
                f"{', '.join(usable) or 'none'}.",
                param="platform",
            )
        return name
    usable = [n for n in registry.load_all("platform") if hooks.platform_check(n) is None]
    if not usable:
        raise UnknownPluginError(registry.excluded_note("platform") or "No installed platform plugin can run here; "
                                 "install frame-platform-cpu.", param="platform")
    return max(usable, key=lambda n: (hooks.platform_priority(n), n))


def select_attention(hooks: PluginHooks, name: str, platform: Platform) -> str:
    """The attention backend: ``name`` if it can run on ``platform``, or the platform's choice for ``auto``."""
    registry = hooks.registry
    if name == "auto":
        # The platform chooses among the backends that can serve here, so a preferred backend that cannot (a
        # native kernel without a compiler) gives way to the next instead of failing the start.
        serving = [n for n in registry.load_all("attention") if _can_serve(hooks, n, platform)]
        excluded = registry.excluded_note("attention")
        if excluded:
            raise UnknownPluginError(excluded, param="attn")
        name = platform.preferred_attention(serving or registry.names("attention"))
    registry.load("attention", name)
    supported = hooks.attention_platforms(name)
    reason = None
    if platform.name not in supported:
        reason = f"runs on {', '.join(supported) or 'no platform'} only, but this machine is {platform.describe()}"
    else:
        reason = hooks.attention_check(name, platform)
    if reason is not None:
        serve = [n for n in registry.load_all("attention") if n != name and _can_serve(hooks, n, platform)]
        raise PluginUnavailableError(
            f"The attention backend '{name}' {reason.rstrip('.')}; installed backends that would serve here: "
            f"{', '.join(serve) or 'none'}.",
            param="attn",
        )
    return name


def _can_serve(hooks: PluginHooks, name: str, platform: Platform) -> bool:
    return platform.name in hooks.attention_platforms(name) and hooks.attention_check(name, platform) is None


def select_dtype(config: EngineConfig, platform: Platform) -> torch.dtype:
    dtype = platform.default_dtype if config.dtype == "auto" else _DTYPES[config.dtype]
    if dtype not in platform.supported_dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in platform.supported_dtypes)
        raise ConfigError(f"dtype {config.dtype} is not supported on {platform.describe()}; use one of: {names}.",
                          param="dtype")
    return dtype


def select_kv_dtype(hooks: PluginHooks, config: EngineConfig, attn: str, dtype: torch.dtype) -> torch.dtype:
    """The KV pool's dtype; a backend that does not declare ``--kv-cache-dtype``'s value is refused in one sentence
    naming the backends that do."""
    name = config.kv_cache_dtype
    if name != "auto" and name not in hooks.attention_kv_dtypes(attn):
        able = [n for n in hooks.registry.load_all("attention") if name in hooks.attention_kv_dtypes(n)]
        choose = f"choose --attn {' or '.join(able)}, or " if able else ""
        raise ConfigError(
            f"The attention backend '{attn}' does not support --kv-cache-dtype {name} (it reads "
            f"{', '.join(hooks.attention_kv_dtypes(attn))}); {choose}use --kv-cache-dtype auto.",
            param="kv_cache_dtype")
    return resolve_kv_dtype(name, dtype)


def select(config: EngineConfig, hooks: PluginHooks) -> Selection:
    """Resolve every plugin choice of ``config``; raises a usage error naming the fix."""
    platform_name = select_platform(hooks, config.platform)
    platform_opts = _options(hooks, config, "platform", platform_name)
    platform = hooks.create_platform(platform_name, platform_opts)
    platform.name = platform_name
    attn = select_attention(hooks, config.attn, platform)
    hooks.registry.load("cache", config.cache)
    hooks.registry.load("scheduler", config.sched)
    options = {
        "platform": platform_opts,
        "attention": _options(hooks, config, "attention", attn),
        "cache": _options(hooks, config, "cache", config.cache),
        "scheduler": _options(hooks, config, "scheduler", config.sched),
    }
    proposer = config.speculative_proposer
    if proposer is not None:
        hooks.registry.load("proposer", proposer)
        options["proposer"] = _options(hooks, config, "proposer", proposer)
    elif config.speculative_options:
        raise ConfigError("speculative_options were given without speculative_proposer; name the proposer "
                          "(--speculative-proposer ngram).", param="speculative_options")
    dtype = select_dtype(config, platform)
    return Selection(platform, platform_name, attn, config.cache, config.sched, dtype, options, proposer,
                     select_kv_dtype(hooks, config, attn, dtype))


def select_model_family(hooks: PluginHooks, architecture: str) -> str:
    """The installed model family that builds ``architecture`` (see :mod:`frame.plugins.families`)."""
    return family_for(hooks, architecture)


def context_length(config: EngineConfig, source: ModelSource) -> int:
    """The engine's context length: ``max_model_len``, or the model's own where it is not set. A length beyond
    the model's is refused, as vLLM does, rather than clamped without a word."""
    model_len = source.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > model_len:
        raise ConfigError(
            f"--max-model-len {config.max_model_len} is beyond {source.name}'s context length of {model_len} tokens "
            f"(max_position_embeddings in its config); pass at most {model_len}, or leave it unset.",
            param="max_model_len")
    return config.max_model_len or model_len


def check_tensor_parallel_family(hooks: PluginHooks, config: EngineConfig, family: str) -> None:
    """A fallback family runs each layer whole on one rank (its modules are the library's own), so tensor
    parallelism with one is refused here, before any worker starts, instead of failing in every worker."""
    if config.tensor_parallel_size > 1 and hooks.model_is_fallback(family):
        raise ConfigError(
            f"The model family '{family}' is a fallback that runs a model on one rank only; serve it with "
            f"--tensor-parallel-size 1 (or install a native family for its architecture).",
            param="tensor_parallel_size")


def declared_quantization(hf_config: object) -> str | None:
    """The ``quant_method`` a checkpoint's config.json declares in ``quantization_config`` (None: none)."""
    declared = getattr(hf_config, "quantization_config", None)
    if declared is None:
        return None
    method = declared.get("quant_method") if isinstance(declared, dict) else getattr(declared, "quant_method", None)
    return str(getattr(method, "value", method)) if method else "an unnamed method"


def _default_quantization(hooks: PluginHooks, source: ModelSource, platform: Platform | None) -> str | None:
    """``gguf`` for a ``.gguf`` file when that plugin is installed and the platform has a kernel for one of its
    block formats (without one, every call would dequantise: dense weights are faster); else None."""
    if not source.is_gguf or "gguf" not in hooks.registry.names("quantization"):
        return None
    if platform is not None:
        formats = set(hooks.create_quantization("gguf", None).formats)
        if not formats & set(platform.kernel_paths()):
            log.info("dense weights for %s: the platform has no kernel for ggml blocks", source.path.name)
            return None
    return "gguf"


def select_quantization(hooks: PluginHooks, config: EngineConfig, source: ModelSource,
                        platform: Platform | None = None) -> QuantizationMethod | None:
    """The quantization method of this run: ``--quantization``, else the one the checkpoint's
    ``quantization_config`` names, else ``gguf`` for a ``.gguf`` file (:func:`_default_quantization`); None for
    dense weights, which ``--quantization none`` asks for. A declared method no installed plugin provides, a flag
    that contradicts the checkpoint, or a method that cannot serve the checkpoint is one sentence."""
    wanted, declared = config.quantization, declared_quantization(source.hf_config)
    installed = hooks.registry.names("quantization")
    if wanted == "none" and declared is None:
        return None
    if declared is not None:
        if declared not in installed:
            raise ConfigError(
                f"The checkpoint's config.json names quantization method '{declared}' (quantization_config), which "
                f"no installed quantization plugin provides; installed: {', '.join(installed) or 'none'}.",
                param="quantization")
        if wanted is not None and wanted != declared:
            raise ConfigError(
                f"The checkpoint is quantized with '{declared}' (quantization_config in its config.json), which "
                f"--quantization {wanted} cannot read; drop the flag or pass --quantization {declared}.",
                param="quantization")
        wanted = declared
    if wanted is None:
        wanted = _default_quantization(hooks, source, platform)
    if wanted is None:
        if config.quantization_options:
            raise ConfigError("quantization_options were given without quantization; name the method "
                              "(--quantization int8).", param="quantization_options")
        return None
    hooks.registry.load("quantization", wanted)
    method = hooks.create_quantization(wanted, _options(hooks, config, "quantization", wanted))
    reason = method.check(source.path, source.hf_config)
    if reason is not None:
        raise ConfigError(f"--quantization {wanted} cannot serve {source.path.name}: {reason.rstrip('.')}.",
                          param="quantization")
    return method


def model_options(hooks: PluginHooks, config: EngineConfig, family: str) -> BaseModel | None:
    """The family's options from ``model_options`` (``--model-opt``), validated against its options model."""
    return _options(hooks, config, "model", family)


def preflight(config: EngineConfig, hooks: PluginHooks | None = None) -> Selection:
    """Everything that can be checked without loading the model: plugin choices, their options, the model path,
    its context length, and a tensor-parallel size its family can run.

    The engine process of ``frame serve`` runs it before it loads anything (the server process too where the
    engine runs in it or on Ray), so a mistake is one line, not a traceback after minutes of loading.
    """
    from frame.model_source import ModelSource
    from frame.plugins.registry import PluginRegistry

    hooks = hooks or PluginHooks(PluginRegistry())
    selection = select(config, hooks)
    source = ModelSource.open(config.model, config.tokenizer, config.trust_remote_code)
    context_length(config, source)
    select_quantization(hooks, config, source)  # the platform's kernels are the worker's to load (and build)
    family = select_model_family(hooks, source.architecture)
    check_tensor_parallel_family(hooks, config, family)
    model_options(hooks, config, family)
    if config.tool_parser is not None:  # frame serve's: an unknown parser or option is one line, not a 500 later
        _options(hooks, config, "tool_parser", config.tool_parser)
    return selection
