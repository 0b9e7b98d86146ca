"""``frame serve``: the OpenAI-compatible API over one engine (in a child process unless ``--engine inproc``), or
over ``--data-parallel-size N`` engine cores (child processes, or Ray actors with ``--distributed-backend ray``)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from frame.cli.engine_flags import add_engine_flags, config_from_args
from frame.config import EngineConfig
from frame.errors import ConfigError

#: The engine forms of ``--engine`` (frame.engine.client's ENGINE_MODES, spelled out: importing the engine here would
#: import torch before ``--help`` or a used port could answer).
ENGINE_MODES = ("mp", "inproc")
#: Flags that must be at least 1 (the rest of the numeric server flags must be positive, or 0 for max-logprobs).
_COUNTS = ("max_n", "max_waiting_requests", "max_tokens_limit", "max_stop_chars", "max_prompt_chars",
           "max_stop_token_ids", "max_choice_chars",
           "max_body_bytes", "max_connections", "max_connections_per_client", "max_connections_per_key",
           "tokenizer_workers", "max_template_renders_per_client")
_SECONDS = ("drain_timeout", "header_timeout", "body_timeout", "keep_alive_timeout", "tokenize_timeout",
            "grammar_compile_timeout")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=int, default=8000, help="port to listen on")
    server.add_argument("--api-key", action="append", default=None, metavar="KEY",
                        help="require 'Authorization: Bearer KEY' on every endpoint but /health; repeat for several "
                             "keys (default: $FRAME_API_KEY)")
    server.add_argument("--api-key-file", default=None, metavar="PATH", help="more API keys, one a line")
    server.add_argument("--cache-salt-from", choices=("api-key", "request"), default=None,
                        help="api-key: salt every request's prefix cache with its key's digest, so tenants never "
                             "share prefixes; request: only the request's cache_salt (default: api-key when more "
                             "than one key is configured)")
    server.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="model name(s) the API answers to (default: the model's name)")
    server.add_argument("--engine", choices=ENGINE_MODES, default="mp",
                        help="mp: engine core in a child process; inproc: in a thread of the server")
    server.add_argument("--on-engine-death", choices=("restart", "exit"), default="restart",
                        help="restart the engine (with back-off), or exit with status 1 for a supervisor")
    server.add_argument("--max-engine-restarts", type=int, default=5,
                        help="engine deaths in a row after which the server exits with status 1")
    server.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds running requests may finish after SIGTERM")
    server.add_argument("--prompt-tokens-details", action=argparse.BooleanOptionalAction, default=True,
                        help="report usage.prompt_tokens_details.cached_tokens")
    server.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                        help="a Jinja chat template, or a file holding one, to render chats with instead of the "
                             "tokenizer's own (default: the tokenizer's)")
    server.add_argument("--trust-request-chat-template", action="store_true",
                        help="render chat templates that requests send (chat_template); refused otherwise")
    server.add_argument("--tokenizer-workers", type=int, default=2,
                        help="chat-template worker processes, and tokenizer threads")
    server.add_argument("--tokenize-timeout", type=float, default=10.0,
                        help="seconds a chat template may render, or a prompt tokenise, before a 400")
    server.add_argument("--max-template-renders-per-client", type=int, default=None,
                        help="request-supplied chat templates one client (its API key, else its address) may have "
                             "rendering or waiting at once; past it 429 (default: half of the workers that render "
                             "request templates, at least 1)")
    server.add_argument("--enable-reset-prefix-cache", action="store_true",
                        help="serve POST /reset_prefix_cache, which empties the prefix cache (benchmarks resending "
                             "the same prompts start each run cold); off by default, as in vLLM")
    server.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="how much the server and the engine log: info adds the start-up summary and request "
                             "errors, debug each plugin choice and step detail")
    limits = parser.add_argument_group("request limits")
    limits.add_argument("--max-n", type=int, default=16, help="most completions per request")
    limits.add_argument("--max-tokens-limit", type=int, default=None, help="largest max_tokens a request may ask")
    limits.add_argument("--max-logprobs", type=int, default=20, help="largest logprobs / top_logprobs")
    limits.add_argument("--max-waiting-requests", type=int, default=512,
                        help="sequences waiting for a first token before new requests get 503")
    limits.add_argument("--max-stop-chars", type=int, default=4096, help="characters of all stop strings together")
    limits.add_argument("--max-stop-token-ids", type=int, default=256, help="ids in a request's stop_token_ids")
    limits.add_argument("--max-choice-chars", type=int, default=16384,
                        help="characters of one structured_outputs.choice string")
    limits.add_argument("--grammar-compile-timeout", type=float, default=20.0,
                        help="seconds a request's constraint may take to compile before it is answered 400")
    limits.add_argument("--max-prompt-chars", type=int, default=1 << 20,
                        help="characters a request may tokenise: its text prompts, or its rendered conversation")
    http = parser.add_argument_group("connection limits")
    http.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body (413 above)")
    http.add_argument("--header-timeout", type=float, default=10.0,
                      help="seconds a connection has to send a request's headers")
    http.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request has to send its body")
    http.add_argument("--keep-alive-timeout", type=float, default=5.0,
                      help="seconds an idle kept-alive connection stays open")
    http.add_argument("--max-connections", type=int, default=1024,
                      help="open connections; past it new ones get 503 and are closed")
    http.add_argument("--max-connections-per-client", type=int, default=None,
                      help="open connections from one client address; past it new ones get 429 (default: half of "
                      "--max-connections)")
    http.add_argument("--max-connections-per-key", type=int, default=None,
                      help="requests in flight with one API key; past it new ones get 429 (default: half of "
                      "--max-connections)")
    add_engine_flags(parser, model_positional=True)


def _check(args: argparse.Namespace) -> None:
    for flag in (*_COUNTS, *_SECONDS, "max_logprobs", "max_engine_restarts"):
        value = getattr(args, flag)
        lowest = 0 if flag in ("max_logprobs", "max_engine_restarts") else 1 if flag in _COUNTS else 0.001
        if value is not None and value < lowest:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {value}.", param=flag)


def chat_template(value: str | None) -> str | None:
    """``--chat-template``'s template: the file's text when it names a file, else the value itself (as vLLM reads
    it). A value with no Jinja in it that names no file is a missing file, not a template."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if "{" not in value:
        raise ConfigError(f"Chat template file {value} does not exist; pass an existing file or the template itself "
                          "to --chat-template.", param="chat_template")
    return value


def api_keys(args: argparse.Namespace) -> list[str]:
    """Keys from ``--api-key`` (or ``$FRAME_API_KEY``) and ``--api-key-file``."""
    from frame.server.auth import check_keys, read_key_file

    keys = list(args.api_key or [])
    if not keys and os.environ.get("FRAME_API_KEY"):
        keys.append(os.environ["FRAME_API_KEY"])
    if args.api_key_file:
        keys += read_key_file(args.api_key_file)
    check_keys(keys)
    if args.cache_salt_from == "api-key" and not keys:
        raise ConfigError("--cache-salt-from api-key needs API keys; give --api-key or --api-key-file.",
                          param="cache_salt_from")
    return list(dict.fromkeys(keys))


#: ``frame serve``'s step budget where neither ``--max-num-batched-tokens`` nor the config file sets one and chunked
#: prefill is on: vLLM's CPU server's (its offline ``LLM`` keeps 4096, as frame's does). A smaller step lets decodes
#: ride along with a long queue of prefills instead of waiting behind it: at concurrency 32 on 2 cores, 2048 served
#: 88.7 tok/s with an 8.7 s median TTFT, 4096 74.8 tok/s and 11.4 s, 1024 82.2 tok/s (docs/performance-history.md).
SERVE_MAX_NUM_BATCHED_TOKENS = 2048
#: ``frame serve``'s tool-call parser where neither ``--tool-parser`` nor the config file names one.
DEFAULT_TOOL_PARSER = "hermes"


def serve_config(args: argparse.Namespace) -> EngineConfig:
    """The engine config of ``frame serve``: the flags and ``--config``, then the serving defaults where neither
    sets them (the step budget, the tool parser, decode graphs recorded at start)."""
    defaults: dict[str, object] = {"tool_parser": DEFAULT_TOOL_PARSER, "record_graphs_at_start": True}
    config = config_from_args(args, defaults)
    if "max_num_batched_tokens" not in config.model_fields_set and config.enable_chunked_prefill:
        config = config_from_args(args, {**defaults, "max_num_batched_tokens": SERVE_MAX_NUM_BATCHED_TOKENS})
    return config


def engine_checks_itself(mode: str, config: EngineConfig) -> bool:
    """Whether the engine core runs in child processes of this one (``--engine mp``, one core or data-parallel
    cores, not Ray actors), each of which checks the plugins and the model before it loads anything."""
    return mode == "mp" and config.distributed_backend != "ray"


def run(args: argparse.Namespace) -> int:
    from frame.listen import bind_socket

    _check(args)
    sock = bind_socket(args.host, args.port)  # a port in use fails now, in a second, not after the engine loaded
    from frame.engine.client import uses_cores_apart
    from frame.server import HttpLimits, ServerLimits, ServerSettings, build_app
    from frame.server.runner import run_server

    config = serve_config(args)
    # A plugin that cannot run here, or a missing model, fails in one line (exit 2) before the model loads: the
    # engine processes check that first, so this one need not import torch (and starts seconds sooner).
    if not engine_checks_itself(args.engine, config):
        from frame.engine.selection import preflight

        preflight(config)
    if uses_cores_apart(args.engine, config) or config.data_parallel_size > 1:  # one core has no router
        from frame.engine.client.dp import check_data_parallel

        check_data_parallel(args.engine, config)
    http = HttpLimits(max_body_bytes=args.max_body_bytes, header_timeout_s=args.header_timeout,
                      body_timeout_s=args.body_timeout, keep_alive_s=args.keep_alive_timeout,
                      max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
                      max_connections_per_key=args.max_connections_per_key)
    settings = ServerSettings(
        served_model_names=args.served_model_name or [], api_keys=api_keys(args), cache_salt_from=args.cache_salt_from,
        engine_mode=args.engine, drain_timeout_s=args.drain_timeout, on_engine_death=args.on_engine_death,
        max_engine_restarts=args.max_engine_restarts, prompt_tokens_details=args.prompt_tokens_details,
        trust_request_chat_template=args.trust_request_chat_template, tokenizer_workers=args.tokenizer_workers,
        tokenize_timeout_s=args.tokenize_timeout,
        max_template_renders_per_client=args.max_template_renders_per_client,
        grammar_compile_timeout_s=args.grammar_compile_timeout, http=http,
        tool_parser=config.tool_parser or DEFAULT_TOOL_PARSER,
        tool_parser_options=config.tool_parser_options,
        enable_reset_prefix_cache=args.enable_reset_prefix_cache, chat_template=chat_template(args.chat_template),
        limits=ServerLimits(max_n=args.max_n, max_tokens=args.max_tokens_limit, max_logprobs=args.max_logprobs,
                            max_waiting_requests=args.max_waiting_requests, max_stop_chars=args.max_stop_chars,
                            max_prompt_chars=args.max_prompt_chars, max_stop_token_ids=args.max_stop_token_ids,
                            max_choice_chars=args.max_choice_chars),
    )
    logging.getLogger("frame").setLevel(args.log_level.upper())
    return run_server(build_app(config, settings), args.host, args.port, args.drain_timeout, args.log_level, http,
                      sock)
