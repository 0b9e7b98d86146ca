"""``frame serve``: the OpenAI-compatible API over one engine (in a child process unless ``--engine inproc``)."""

from __future__ import annotations

import argparse
import logging
import os

from frame.cli.engine_flags import add_engine_flags, config_from_args
from frame.engine.mp import ENGINE_MODES
from frame.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=int, default=8000, help="port to listen on")
    server.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                             "(default: $FRAME_API_KEY)")
    server.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="model name(s) the API answers to (default: the model's name)")
    server.add_argument("--engine", choices=ENGINE_MODES, default="mp",
                        help="mp: engine core in a child process; inproc: in a thread of the server")
    server.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds running requests may finish after SIGTERM")
    server.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    limits = parser.add_argument_group("request limits")
    limits.add_argument("--max-n", type=int, default=16, help="most completions per request")
    limits.add_argument("--max-tokens-limit", type=int, default=None, help="largest max_tokens a request may ask")
    limits.add_argument("--max-logprobs", type=int, default=20, help="largest logprobs / top_logprobs")
    limits.add_argument("--max-waiting-requests", type=int, default=512,
                        help="sequences waiting for a first token before new requests get 503")
    add_engine_flags(parser)


def run(args: argparse.Namespace) -> int:
    from frame.server import ServerLimits, ServerSettings, build_app
    from frame.server.runner import run_server

    for flag in ("max_n", "max_logprobs", "max_waiting_requests", "max_tokens_limit"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag == "max_logprobs" else 1):
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {value}.", param=flag)
    config = config_from_args(args)
    from frame.engine.selection import preflight

    preflight(config)  # a plugin that cannot run here fails now, in one line, before any process starts
    settings = ServerSettings(
        served_model_names=args.served_model_name or [], api_key=args.api_key or os.environ.get("FRAME_API_KEY"),
        engine_mode=args.engine, drain_timeout_s=args.drain_timeout,
        limits=ServerLimits(max_n=args.max_n, max_tokens=args.max_tokens_limit, max_logprobs=args.max_logprobs,
                            max_waiting_requests=args.max_waiting_requests),
    )
    logging.getLogger("frame").setLevel(args.log_level.upper())
    run_server(build_app(config, settings), args.host, args.port, args.drain_timeout, args.log_level)
    return 0
