"""Hook implementations of the ``cuda`` platform."""

from __future__ import annotations

from frame.errors import PluginUnavailableError
from frame.hookspecs import hookimpl
from frame.interfaces.platform import Platform
from pydantic import BaseModel

from frame_platform_cuda.platform import CudaOptions, CudaPlatform

FRAME_API_VERSION = 2

#: Outranks the cpu platform's 0.
PRIORITY = 100


@hookimpl
def frame_plugin_options() -> type[BaseModel] | None:
    """The device index and the activation reserve."""
    return CudaOptions


@hookimpl
def frame_platform_check() -> str | None:
    """Asks torch only: no device memory is touched."""
    return CudaPlatform.unavailable_reason()


@hookimpl
def frame_platform_priority() -> int:
    return PRIORITY


@hookimpl
def frame_platform_create(options: BaseModel | None) -> Platform:
    """A CudaPlatform; refuses with the check's sentence when no CUDA device is visible."""
    reason = CudaPlatform.unavailable_reason()
    if reason is not None:
        raise PluginUnavailableError(f"The cuda platform cannot run here: {reason}.", param="platform")
    if options is not None and not isinstance(options, CudaOptions):
        options = CudaOptions.model_validate(options.model_dump())
    return CudaPlatform(options)
