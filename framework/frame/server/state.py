"""ServerState: what the request handlers share (engine, tokenizer, prompts, limits, metrics, draining flag,
stored responses)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from frame.config import resolve_plugin_options
from frame.engine.client import AsyncEngine, EngineClient
from frame.engine.wire.client_core import Ready
from frame.interfaces.tool_parser import ToolParser
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.server.constraints import ConstraintChecker
from frame.server.metrics import ServerMetrics
from frame.server.prompts import Prompts
from frame.server.response_store import ResponseStore
from frame.server.settings import ServerSettings


@dataclass
class ServerState:
    """One per app, built by the lifespan once the engine is ready.

    ``waiting`` counts sequences the server has sent to the engine that have not produced a first token yet;
    it is what ``--max-waiting-requests`` bounds. ``client`` and ``engine`` change when the supervisor restarts
    a dead engine, so handlers read them from here at the moment they need them.
    """

    settings: ServerSettings
    client: EngineClient
    engine: AsyncEngine
    tokenizer: Any
    info: Ready
    metrics: ServerMetrics
    prompts: Prompts
    constraints: ConstraintChecker
    draining: bool = False
    waiting: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    responses: ResponseStore = field(default_factory=ResponseStore)

    @property
    def model_names(self) -> list[str]:
        return self.settings.served_model_names or [self.info.model_name]

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @functools.cached_property
    def tool_parser(self) -> ToolParser:
        """The ``--tool-parser`` plugin with its ``--tool-parser-opt`` options, loaded on the first chat request with
        ``tool_choice: auto``."""
        hooks = PluginHooks(PluginRegistry())
        name = self.settings.tool_parser
        options = resolve_plugin_options("tool_parser", name, self.settings.tool_parser_options,
                                         hooks.options_model("tool_parser", name))
        return hooks.create_tool_parser(name, options)

    @property
    def ready(self) -> bool:
        """What ``/health`` reports: an engine core serves and the server is not draining."""
        return self.client.healthy and not self.draining

    def replace_engine(self, client: EngineClient) -> AsyncEngine:
        """Serve from a freshly started engine (after the old one died)."""
        assert client.info is not None
        self.client, self.info = client, client.info
        self.engine = AsyncEngine(client, self.tokenizer)
        return self.engine
