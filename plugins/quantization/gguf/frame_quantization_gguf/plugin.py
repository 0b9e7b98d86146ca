"""Hook implementations of the ``gguf`` quantization plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.quantization import QuantizationMethod
from pydantic import BaseModel

from frame_quantization_gguf.method import GGUFMethod, GGUFOptions

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel] | None:
    """Which block formats stay packed."""
    return GGUFOptions


@hookimpl
def frame_quantization_create(options: BaseModel | None) -> QuantizationMethod:
    """A GGUFMethod with the validated options (defaults when None)."""
    if options is not None and not isinstance(options, GGUFOptions):
        options = GGUFOptions.model_validate(options.model_dump())
    return GGUFMethod(options)
