"""Hook implementations of the ``int8`` quantization plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.quantization import QuantizationMethod
from pydantic import BaseModel

from frame_quantization_int8.method import Int8Method, Int8Options

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel] | None:
    """Whether activations are quantized too, and which layers stay dense."""
    return Int8Options


@hookimpl
def frame_quantization_create(options: BaseModel | None) -> QuantizationMethod:
    """An Int8Method with the validated options (defaults when None)."""
    if options is not None and not isinstance(options, Int8Options):
        options = Int8Options.model_validate(options.model_dump())
    return Int8Method(options)
