"""The int4_g128 quantization plugin: its hooks."""

from __future__ import annotations

from frame import hookimpl
from frame.interfaces.quantization import QuantizationMethod
from pydantic import BaseModel

from frame_quantization_int4_g128.method import Int4Group128Method

FRAME_API_VERSION = 2


@hookimpl
def frame_quantization_create(options: BaseModel | None) -> QuantizationMethod:
    """An Int4Group128Method."""
    return Int4Group128Method()
