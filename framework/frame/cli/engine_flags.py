"""Engine flags generated from EngineConfig, so every config key has exactly one flag and the two never drift.

Flags default to None (not given), so values from ``--config`` apply unless a flag overrides them.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from frame.cli.vllm_flags import add_model_positional, add_vllm_aliases, alias_values
from frame.config import OPTION_SECTIONS, EngineConfig, build_config, load_yaml, parse_key_values

#: Flag spelling for the per-kind option sections: ``--cache-opt key=value``.
OPTION_FLAGS = {section: f"--{section.removesuffix('_options').replace('_', '-')}-opt"
                for section in OPTION_SECTIONS.values()}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(annotation: Any) -> Any:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])
    return annotation


def _help(field: Any) -> str:
    """The field's description, with its EngineConfig default where the description does not state one (the flag
    itself defaults to None, so that ``--config`` values apply)."""
    text = field.description or ""
    if "default" in text or field.default_factory is not None:
        return text
    default = field.default
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{text} (default: {shown})"


def add_engine_flags(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
    """Add ``--config``, one flag per EngineConfig field, the ``--<kind>-opt`` flags and vLLM's names for some of
    them; with ``model_positional``, the model may also be given as the first argument."""
    if model_positional:
        add_model_positional(parser)
    group = parser.add_argument_group("engine")
    group.add_argument("--config", help="YAML file of engine settings; flags override it")
    for name, field in EngineConfig.model_fields.items():
        if name in OPTION_SECTIONS.values():
            group.add_argument(OPTION_FLAGS[name], action="append", metavar="KEY=VALUE", dest=name,
                               help=field.description)
            continue
        kind = _base_type(field.annotation)
        if kind is bool:
            group.add_argument(_flag(name), action=argparse.BooleanOptionalAction, default=None, help=_help(field))
        elif typing.get_origin(kind) is typing.Literal:
            group.add_argument(_flag(name), choices=typing.get_args(kind), default=None, help=_help(field))
        else:
            group.add_argument(_flag(name), type=kind if kind in (int, float) else str, default=None,
                               help=_help(field))
    add_vllm_aliases(parser)


def config_from_args(args: argparse.Namespace, defaults: dict[str, Any] | None = None) -> EngineConfig:
    """The EngineConfig of ``--config`` merged with the flags given; ``defaults`` (a command's own) fill in the keys
    that neither sets."""
    file_values = {**(defaults or {}), **(load_yaml(args.config) if args.config else {})}
    flags: dict[str, Any] = {}
    for name in EngineConfig.model_fields:
        value = getattr(args, name, None)
        if name in OPTION_SECTIONS.values():
            value = parse_key_values(value, OPTION_FLAGS[name]) or None
        flags[name] = value
    return build_config(file_values, **alias_values(args, flags))
