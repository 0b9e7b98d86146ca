"""ServerSettings: what ``frame serve`` adds to the engine's config (names, key, limits, engine mode)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServerLimits:
    """Per-request limits the server enforces before a request reaches the engine (all answer 400 when exceeded,
    except a full waiting queue, which answers 503 with Retry-After)."""

    max_n: int = 16
    max_tokens: int | None = None
    max_logprobs: int = 20
    max_stop: int = 16
    max_waiting_requests: int = 512
    max_prompts: int = 64


@dataclass
class ServerSettings:
    """Everything the app needs besides the EngineConfig."""

    served_model_names: list[str] = field(default_factory=list)
    api_key: str | None = None
    engine_mode: str = "mp"
    limits: ServerLimits = field(default_factory=ServerLimits)
    drain_timeout_s: float = 30.0
    retry_after_s: int = 1
