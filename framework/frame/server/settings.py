"""ServerSettings: what ``frame serve`` adds to the engine's config (names, keys, limits, engine mode, supervision).

Every limit has a safe default; docs/serving.md ("Security and limits") lists each with its flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class ServerLimits:
    """Per-request limits the server enforces before a request reaches the engine (all answer 400 when exceeded,
    except a full waiting queue, which answers 503 with Retry-After)."""

    max_n: int = 16
    max_tokens: int | None = None
    max_logprobs: int = 20
    max_stop: int = 16
    #: Characters of all of a request's stop strings together (each step searches the new text for them).
    max_stop_chars: int = 4096
    max_waiting_requests: int = 512
    max_prompts: int = 64
    #: Characters a request may ask to tokenise: its text prompts together, or its rendered conversation.
    max_prompt_chars: int = 1 << 20
    #: Token ids in a request's ``stop_token_ids`` (each step checks the new token against them).
    max_stop_token_ids: int = 256
    #: Characters of one ``structured_outputs.choice`` string (its compile time grows with the square).
    max_choice_chars: int = 16384


@dataclass
class HttpLimits:
    """Limits of the HTTP layer, enforced before a request is routed (and before the API key is checked)."""

    max_body_bytes: int = 4 << 20
    #: Seconds a connection has to send a request's complete headers (from connecting, or from its first byte).
    header_timeout_s: float = 10.0
    #: Seconds a request has to send its complete body once the app starts reading it.
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 1024
    #: Open connections from one client address (429 past it); None: half of ``max_connections``.
    max_connections_per_client: int | None = None
    #: Requests in flight with one API key (429 past it); None: half of ``max_connections``.
    max_connections_per_key: int | None = None
    #: Bytes of a request's line and headers together (431 past it).
    max_header_bytes: int = 16 << 10

    @property
    def per_client_cap(self) -> int:
        return self.max_connections_per_client or max(self.max_connections // 2, 1)

    @property
    def per_key_cap(self) -> int:
        return self.max_connections_per_key or max(self.max_connections // 2, 1)


@dataclass
class ServerSettings:
    """Everything the app needs besides the EngineConfig."""

    served_model_names: list[str] = field(default_factory=list)
    api_keys: list[str] = field(default_factory=list)
    #: "api-key": every request's prefix-cache entries are salted with its key's digest; "request": only the
    #: request's own ``cache_salt``. None: "api-key" when more than one key is configured.
    cache_salt_from: Literal["api-key", "request"] | None = None
    engine_mode: str = "mp"
    limits: ServerLimits = field(default_factory=ServerLimits)
    http: HttpLimits = field(default_factory=HttpLimits)
    drain_timeout_s: float = 30.0
    retry_after_s: int = 1
    on_engine_death: Literal["restart", "exit"] = "restart"
    max_engine_restarts: int = 5
    prompt_tokens_details: bool = True
    trust_request_chat_template: bool = False
    tokenizer_workers: int = 2
    tokenize_timeout_s: float = 10.0
    #: Request-supplied templates one client (API key, else address) may have rendering or queued for the lane
    #: at once (429 past it); None: half of the lane's places, at least 1 (``--max-template-renders-per-client``).
    max_template_renders_per_client: int | None = None
    #: Seconds the server gives a constraint to compile before answering 400 (``--grammar-compile-timeout``).
    grammar_compile_timeout_s: float = 20.0
    #: The tool-call parser plugin for chat completions with ``tool_choice: auto``.
    tool_parser: str = "hermes"
    #: Its options (``--tool-parser-opt KEY=VALUE``, ``tool_parser_options`` in a config file), validated against
    #: its ``frame_plugin_options`` model when the server starts.
    tool_parser_options: dict[str, Any] = field(default_factory=dict)
    #: Serve ``POST /reset_prefix_cache`` (benchmarks that resend the same prompts start each run cold).
    enable_reset_prefix_cache: bool = False
    #: A Jinja chat template that replaces the tokenizer's own (``--chat-template``); None: the tokenizer's.
    chat_template: str | None = None

    @property
    def salt_by_key(self) -> bool:
        if self.cache_salt_from is None:
            return len(self.api_keys) > 1
        return self.cache_salt_from == "api-key"
