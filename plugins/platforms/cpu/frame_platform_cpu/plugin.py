"""Hook implementations of the ``cpu`` platform."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.platform import Platform
from pydantic import BaseModel

from frame_platform_cpu.platform import CpuOptions, CpuPlatform

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel] | None:
    """Threads and the KV memory cap."""
    return CpuOptions


@hookimpl
def frame_platform_check() -> str | None:
    """The CPU is always available."""
    return CpuPlatform.unavailable_reason()


@hookimpl
def frame_platform_priority() -> int:
    """The fallback: every accelerator outranks it."""
    return 0


@hookimpl
def frame_platform_create(options: BaseModel | None) -> Platform:
    """A CpuPlatform with the validated options (defaults when None)."""
    if options is not None and not isinstance(options, CpuOptions):
        options = CpuOptions.model_validate(options.model_dump())
    return CpuPlatform(options)
