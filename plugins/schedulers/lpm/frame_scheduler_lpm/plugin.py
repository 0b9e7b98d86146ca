"""Hook implementations of the lpm scheduler plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.scheduler import Scheduler, SchedulerLimits
from pydantic import BaseModel

from frame_scheduler_lpm.scheduler import LpmOptions, LpmScheduler

FRAME_API_VERSION = 1


@hookimpl
def frame_plugin_options() -> type[BaseModel]:
    """The lpm scheduler's options: :class:`LpmOptions`."""
    return LpmOptions


@hookimpl
def frame_scheduler_create(limits: SchedulerLimits, cache: KVCacheStrategy, options: BaseModel | None) -> Scheduler:
    """A longest-prefix-match scheduler driving ``cache``; ``options`` is an :class:`LpmOptions` or None."""
    if options is not None and not isinstance(options, LpmOptions):
        raise TypeError(f"the lpm scheduler takes LpmOptions, got {type(options).__name__}")
    return LpmScheduler(limits, cache, options)
