"""Messages between the API server and its constraint worker (:mod:`frame.server.constraint_worker`).

The server sends :class:`CheckInit` once (the engine config, as JSON, which names the model, its tokenizer and the
grammar backend with its options; the vocabulary size and stop tokens), then one :class:`Check` per constraint;
the worker answers :class:`~frame.engine.wire.render.Ready` once (the render workers' message), then one
:class:`Checked` per constraint. No compiled grammar travels back: the server only learns whether the constraint
compiles, and how fast. They travel over the worker's stdin and stdout as length-prefixed frames of the one codec
(:func:`frame.engine.wire.codec.encode_frame`).
"""

from __future__ import annotations

from typing import Union

import msgspec

from frame.engine.wire.render import Ready
from frame.sampling_params import StructuredOutputs


class CheckInit(msgspec.Struct, tag="check_init"):
    """Sent once: what the worker needs to build the grammar backend the engine uses."""

    config_json: str
    vocab_size: int
    stop_token_ids: list[int]


class Check(msgspec.Struct, tag="check"):
    """One constraint to compile (and drop)."""

    spec: StructuredOutputs


class Checked(msgspec.Struct, tag="checked"):
    """The answer to a Check after ``seconds``: it compiled (``message`` None), or the backend refused it with the
    one-sentence ``message`` naming the field ``param``."""

    seconds: float
    message: str | None = None
    param: str | None = None


ToConstraintWorker = Union[CheckInit, Check]  # noqa: UP007 - msgspec needs a typing Union
FromConstraintWorker = Union[Ready, Checked]  # noqa: UP007
