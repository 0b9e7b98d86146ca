"""vLLM's names for settings frame has under names of its own, so a vLLM command line runs as it is.

Each alias sets one EngineConfig key (docs/cli.md has the table side by side with vLLM's flags); given together
with frame's own flag for the same key and a different value, it is one sentence, not a silent winner. ``--dtype
half`` and ``--dtype float`` need no alias here: EngineConfig accepts vLLM's spellings itself.
"""

from __future__ import annotations

import argparse
from typing import Any

from frame.errors import ConfigError


def add_model_positional(parser: argparse.ArgumentParser) -> None:
    """``frame serve MODEL``, as ``vllm serve MODEL``: the same as ``--model MODEL``."""
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="a Hugging Face folder, a .gguf file or a Hub id (org/name); the same as --model")


def add_vllm_aliases(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vLLM's names", "the same settings under the flags vLLM gives them")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                       help="--no-enable-prefix-caching is --cache none (no prefix reuse); --enable-prefix-caching "
                            "keeps --cache's strategy (hashchain unless set)")
    group.add_argument("--enforce-eager", action="store_true", default=None,
                       help="--no-cuda-graphs: every decode step runs eagerly, none replays a recorded graph")
    group.add_argument("--gpu-memory-utilization", type=float, default=None, metavar="FRACTION",
                       help="--kv-cache-fraction: the share of the device's memory (of RAM on a CPU) the weights "
                            "and the KV pool may take together")


def alias_values(args: argparse.Namespace, flags: dict[str, Any]) -> dict[str, Any]:
    """``flags`` (EngineConfig keys from frame's own flags, None where not given) with the aliases applied."""
    out = dict(flags)
    wanted: list[tuple[str, str, Any]] = []  # (alias as typed, config key, value)
    model_tag = getattr(args, "model_tag", None)
    if model_tag is not None:
        wanted.append((f"the positional model {model_tag}", "model", model_tag))
    prefix = getattr(args, "enable_prefix_caching", None)
    if prefix is False:
        wanted.append(("--no-enable-prefix-caching", "cache", "none"))
    elif prefix is True and flags.get("cache") == "none":
        raise ConfigError("--enable-prefix-caching and --cache none contradict each other; drop one.", param="cache")
    if getattr(args, "enforce_eager", None):
        wanted.append(("--enforce-eager", "cuda_graphs", False))
    fraction = getattr(args, "gpu_memory_utilization", None)
    if fraction is not None:
        wanted.append((f"--gpu-memory-utilization {fraction}", "kv_cache_fraction", fraction))
    for alias, key, value in wanted:
        given = out.get(key)
        if given is not None and given != value:
            flag = "--" + key.replace("_", "-")
            flag = (flag if given else f"--no-{flag[2:]}") if isinstance(given, bool) else f"{flag} {given}"
            raise ConfigError(f"{alias} and {flag} ask for different {key} values; give one of them.", param=key)
        out[key] = value
    return out
