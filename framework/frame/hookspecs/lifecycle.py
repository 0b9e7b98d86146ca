"""Lifecycle hooks: events any plugin may observe (metrics exporters, tracers). Every implementer is called."""

from __future__ import annotations

from typing import Any

from frame.hookspecs import hookspec


@hookspec
def frame_engine_started(config: Any) -> None:
    """The engine core finished building (model loaded, pool allocated). ``config`` is the EngineConfig.

    Called once in the engine core's process, before the first step. Since API 1.
    """


@hookspec
def frame_request_finished(seq_id: str, num_prompt_tokens: int, num_output_tokens: int,
                           num_cached_tokens: int, finish_reason: str) -> None:
    """A sequence finished (stopped, hit its length or was aborted).

    Called in the engine core's process right after the step that finished it. Return values are ignored.
    Since API 1.
    """
