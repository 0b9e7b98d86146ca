"""Hooks of quantization plugins (entry-point group ``frame.quantization``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.quantization import QuantizationMethod


@hookspec
def frame_quantization_create(options: BaseModel | None) -> QuantizationMethod:
    """Create the method that keeps the model's linear weights quantized (``--quantization NAME``, or the plugin
    a checkpoint's ``quantization_config.quant_method`` names).

    Called once by every model worker, and by ``frame plugins`` to list the method's formats, before the model is
    built. ``options`` is the plugin's options instance (``--quantization-opt key=value``) or None. The method's
    :meth:`~frame.interfaces.quantization.QuantizationMethod.check` then refuses a checkpoint it cannot serve.
    Since API 2.
    """
