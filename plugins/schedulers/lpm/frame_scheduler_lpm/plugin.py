"""Hook implementations of the lpm scheduler plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from pydantic import BaseModel

from frame_scheduler_lpm.scheduler import LpmOptions, LpmPolicy

FRAME_API_VERSION = 2


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    """The lpm scheduler's options: :class:`LpmOptions`."""
    return LpmOptions


@hookimpl
def frame_scheduler_create(limits: SchedulerLimits, options: BaseModel | None) -> SchedulingPolicy:
    """The longest-prefix-match policy; ``options`` is an :class:`LpmOptions` or None."""
    if options is not None and not isinstance(options, LpmOptions):
        raise TypeError(f"the lpm scheduler takes LpmOptions, got {type(options).__name__}")
    return LpmPolicy(limits, options)
