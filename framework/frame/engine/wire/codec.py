"""The one codec: every message that crosses a process becomes msgpack bytes here (msgspec), never a pickle.

``encode`` takes any wire struct; ``decode(data, kind)`` reads bytes as one wire type or tagged union. Each
direction of each channel has one such kind: ``ToEngine`` / ``FromEngine`` (client and engine core),
``ToWorker`` / ``FromWorker`` (executor and model workers), ``SchedulerOutput`` / ``RunnerOutput`` (a step's plan
and its answer, as Ray passes them). A decoder is built once per kind and reused.
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    """The msgpack bytes of a wire message."""
    return _encoder.encode(msg)


@cache
def _decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    return msgspec.msgpack.Decoder(kind)


def decode(data: bytes | memoryview, kind: type[T]) -> T:
    """Read ``data`` as ``kind`` (a struct or a tagged union of structs); raises ``msgspec.ValidationError`` or
    ``msgspec.DecodeError`` on bytes that are not one."""
    return _decoder(kind).decode(data)
