"""Hooks of scheduler plugins (entry-point group ``frame.schedulers``)."""

from __future__ import annotations

from pydantic import BaseModel

from frame.hookspecs import hookspec
from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.scheduler import Scheduler, SchedulerLimits


@hookspec
def frame_scheduler_create(
    limits: SchedulerLimits, cache: KVCacheStrategy, options: BaseModel | None
) -> Scheduler:
    """Create the scheduler that drives ``cache`` under ``limits``.

    Called once by the engine core, on the selected plugin, right after the cache strategy was created.
    Since API 1.
    """
