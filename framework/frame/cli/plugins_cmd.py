"""``frame plugins``: every installed plugin by kind, its wheel and version, and whether it runs here."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from frame.errors import FrameUsageError
from frame.plugins.hooks import PluginHooks
from frame.plugins.kinds import KINDS
from frame.plugins.registry import PluginRegistry

if TYPE_CHECKING:
    from frame.interfaces.platform import Platform


@dataclass
class PluginStatus:
    """One row of the table."""

    kind: str
    name: str
    wheel: str
    version: str
    runs_here: bool
    why: str


def _runs_here(hooks: PluginHooks, kind: str, name: str, platform: Platform | None) -> tuple[bool, str]:
    reason = hooks.registry.disabled_reason(kind, name)
    if reason is not None:
        return False, reason
    try:
        return _ask(hooks, kind, name, platform)
    except FrameUsageError as err:  # it failed to load, or raised in a probing hook: one line of its own
        return False, str(err)


def _ask(hooks: PluginHooks, kind: str, name: str, platform: Platform | None) -> tuple[bool, str]:
    hooks.registry.load(kind, name)
    if kind == "platform":
        why = hooks.platform_check(name)
        if why is not None:
            return False, why
        notes = f"priority {hooks.platform_priority(name)}"
        if platform is not None and platform.name == name:
            paths = ", ".join(f"{k}: {v}" for k, v in platform.kernel_paths().items())
            notes += f"; {platform.describe()}; auto dtype {str(platform.default_dtype).removeprefix('torch.')}" + (
                f"; {paths}" if paths else "")
        return True, notes
    if kind == "attention":
        supported = hooks.attention_platforms(name)
        kv = f"KV dtypes {', '.join(hooks.attention_kv_dtypes(name))}"
        if platform is None:
            return False, f"no platform can run here; {kv}"
        if platform.name not in supported:
            return False, (f"runs on {', '.join(supported) or 'no platform'} only; this machine is "
                           f"{platform.describe()}; {kv}")
        why = hooks.attention_check(name, platform)
        return why is None, why or f"on {platform.name}; {kv}"
    if kind == "model":
        architectures = hooks.model_architectures(name)
        if hooks.model_is_fallback(name):
            return True, (f"fallback: builds any of {len(architectures)} architectures when no other family lists "
                          "it")
        return True, ", ".join(architectures)
    if kind == "quantization":
        method = hooks.create_quantization(name, None)
        declared = {f.name: f for f in method.packed_formats}
        paths = platform.kernel_paths() if platform is not None else {}
        where = platform.name if platform is not None else "no platform"

        def served(fmt: str) -> str:
            own = declared.get(fmt)
            kernels = f" (its own format; kernels: {', '.join(own.kernels) or 'none'})" if own else ""
            return f"{fmt}: {paths.get(fmt, 'dequantised reference')} on {where}{kernels}"

        return True, "; ".join(served(f) for f in method.formats)
    if kind == "workload":
        return True, ", ".join(w.name for w in hooks.workload_list(name)) or "offers no workload"
    return True, ""


def collect(registry: PluginRegistry | None = None) -> list[PluginStatus]:
    """The status of every installed plugin (loading each; a plugin that fails to load or raises in a hook is
    reported in its own row, never raised)."""
    from frame.engine.selection import select_platform  # imports torch: only when the table is made
    from frame.workloads import register_builtin

    hooks = PluginHooks(registry or PluginRegistry())
    register_builtin(hooks.registry)  # the core's own workloads are a plugin too, listed as in-process
    platform: Platform | None = None
    name: str | None = None
    refused: dict[str, str] = {}  # a platform that was chosen but would not start: why
    try:
        name = select_platform(hooks, "auto")
        platform = hooks.create_platform(name, None)
        platform.name = name
    except FrameUsageError as err:  # the platform's row says why it would not start (FRAME_CPU_DISABLE=amx)
        if name is not None:
            refused[name] = str(err)
    rows = []
    for kind in KINDS:  # in the kinds table's order
        for info in hooks.registry.installed(kind):
            if kind == "platform" and info.name in refused:
                ok, why = False, refused[info.name]
            else:
                ok, why = _runs_here(hooks, kind, info.name, platform)
            version = info.version or "-"
            if info.source is not None:
                version += " (source tree)"
            rows.append(PluginStatus(kind, info.name, info.distribution or "(in-process)", version, ok, why))
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--kinds", action="store_true",
                        help="list the plugin kinds (entry-point group, flag, options, interface, suite) instead")


def _kinds(as_json: bool) -> int:
    """The kinds table itself: what a plugin author needs to start a plugin of any kind."""
    fields = ("name", "title", "group", "flag", "options_key", "options_flag", "interface", "base", "suite",
              "probes")
    rows = [{f: getattr(k, f) for f in fields} for k in KINDS.values()]
    if as_json:
        import json

        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="frame plugin kinds")
    for column in ("kind", "entry-point group", "flag", "options", "interface", "suite"):
        table.add_column(column)
    for k in KINDS.values():
        table.add_row(f"{k.name} ({k.title})", k.group, f"--{k.flag}" if k.flag else "the checkpoint",
                      f"{k.options_key}, {k.options_flag}", f"{k.interface}.{k.base}", k.suite)
    Console().print(table)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.kinds:
        return _kinds(args.json)
    rows = collect()
    if args.json:
        import json

        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return 0
    console = Console()
    # Below 120 columns the wheel and version give way, so the notes keep a readable width (--json has them all).
    wide = console.width >= 120
    table = Table(title="frame plugins" if wide else "frame plugins (wheels and versions: wider terminal or --json)")
    for column in ("kind", "name", "wheel", "version", "runs here"):
        if wide or column not in ("wheel", "version"):
            table.add_column(column, no_wrap=True)
    table.add_column("notes", ratio=1)
    for r in rows:
        cells = (r.kind, r.name, *((r.wheel, r.version) if wide else ()),
                 "[green]yes[/]" if r.runs_here else "[red]no[/]", r.why)
        table.add_row(*cells)
    console.print(table)
    return 0
