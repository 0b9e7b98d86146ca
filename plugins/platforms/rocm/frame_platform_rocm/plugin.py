"""Hook implementations of the ``rocm`` platform."""

from __future__ import annotations

from frame.errors import PluginUnavailableError
from frame.hookspecs import hookimpl
from frame.interfaces.platform import Platform
from pydantic import BaseModel

from frame_platform_rocm.platform import RocmOptions, RocmPlatform

FRAME_API_VERSION = 2

#: Outranks the cpu platform's 0.
PRIORITY = 100


@hookimpl
def frame_plugin_options() -> type[BaseModel] | None:
    """The device index and the activation reserve."""
    return RocmOptions


@hookimpl
def frame_platform_check() -> str | None:
    """Asks torch only: no device memory is touched."""
    return RocmPlatform.unavailable_reason()


@hookimpl
def frame_platform_priority() -> int:
    return PRIORITY


@hookimpl
def frame_platform_create(options: BaseModel | None) -> Platform:
    """A RocmPlatform; refuses with the check's sentence when no ROCm device is visible."""
    reason = RocmPlatform.unavailable_reason()
    if reason is not None:
        raise PluginUnavailableError(f"The rocm platform cannot run here: {reason}.", param="platform")
    if options is not None and not isinstance(options, RocmOptions):
        options = RocmOptions.model_validate(options.model_dump())
    return RocmPlatform(options)
