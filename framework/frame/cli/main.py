"""``frame``: the entry point. Usage errors print one line (no traceback) and exit with status 2."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from frame.errors import FrameUsageError
from frame.version import __version__

#: command name -> (module under frame.cli, one-line help). Each module has ``add_arguments`` and ``run``.
COMMANDS: dict[str, tuple[str, str]] = {
    "plugins": ("plugins_cmd", "list installed plugins, their wheels and whether they run here"),
    "generate": ("generate", "completions for one prompt (streamed) or several (one batch)"),
    "chat": ("chat", "chat with the model interactively"),
    "serve": ("serve", "serve an OpenAI-compatible API"),
    "bench": ("bench", "benchmarks: throughput, latency, serve, and config-driven experiments"),
    "new-plugin": ("new_plugin", "write the skeleton of a new plugin wheel"),
    "cache": ("cache_cmd", "list the converted checkpoints frame keeps, and prune the stale ones"),
}


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default, unless its text already says it or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is argparse.SUPPRESS or default is False
                or "default" in text):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frame", description="A plugin-first LLM inference and serving engine.")
    parser.add_argument("--version", action="version", version=f"frame {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(f"frame.cli.{module}")
        except ModuleNotFoundError as err:
            if err.name != f"frame.cli.{module}":
                raise
            continue
        command = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        mod.add_arguments(command)
        command.set_defaults(run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except FrameUsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
