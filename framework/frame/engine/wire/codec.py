"""The one codec: every message that crosses a process becomes msgpack bytes here (msgspec), never a pickle.

``encode`` takes any wire struct; ``decode(data, kind)`` reads bytes as one wire type or tagged union. Each
direction of each channel has one such kind: ``ToEngine`` / ``FromEngine`` (client and engine core),
``ToWorker`` / ``FromWorker`` (executor and model workers), ``SchedulerOutput`` / ``RunnerOutput`` (a step's plan
and its answer, as Ray passes them), ``ToRenderWorker`` / ``FromRenderWorker`` (the API server and its chat-template
workers, over pipes as length-prefixed frames: :func:`encode_frame`, :func:`read_frame`). A decoder is built once
per kind and reused.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Any, BinaryIO, TypeVar

import msgspec

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
#: A pipe frame's header: the message's length, 4 bytes big-endian.
FRAME_HEADER = struct.Struct(">I")


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


def encode_frame(msg: msgspec.Struct) -> bytes:
    """A wire message as one pipe frame: its length, then its msgpack bytes."""
    data = encode(msg)
    return FRAME_HEADER.pack(len(data)) + data


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's message bytes from a blocking stream; None at its end."""
    head = stream.read(FRAME_HEADER.size)
    if len(head) < FRAME_HEADER.size:
        return None
    return stream.read(FRAME_HEADER.unpack(head)[0])
