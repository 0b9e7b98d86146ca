"""Messages between the API server and its chat-template workers (:mod:`frame.server.render_worker`).

The server sends :class:`Init` once (the model's template, its special tokens, the worker's memory budget), then one
:class:`Render` per conversation; the worker answers :class:`Ready` once, then :class:`Rendered` or
:class:`Refused` per job. They travel over the worker's stdin and stdout as length-prefixed frames of the one codec
(:func:`frame.engine.wire.codec.encode_frame`).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class Init(msgspec.Struct, tag="init"):
    """Sent once: the model's template, its special tokens (``bos_token``, ...) and the memory budget."""

    template: str | None
    variables: dict[str, Any]
    memory_bytes: int


class Render(msgspec.Struct, tag="render"):
    """One conversation; ``template`` replaces the model's (the server allows that only when trusted)."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool
    variables: dict[str, Any]
    template: str | None
    max_chars: int


class Ready(msgspec.Struct, tag="ready"):
    """The worker has loaded the renderer and waits for jobs."""


class Rendered(msgspec.Struct, tag="rendered"):
    """The rendered prompt text."""

    text: str


class Refused(msgspec.Struct, tag="refused"):
    """The template raised, ran out of memory, or rendered more than ``max_chars``."""

    message: str
    code: str


ToRenderWorker = Union[Init, Render]  # noqa: UP007 - msgspec needs a typing Union
FromRenderWorker = Union[Ready, Rendered, Refused]  # noqa: UP007
