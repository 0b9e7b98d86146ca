"""Hook implementations of the priority scheduler plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.scheduler import Scheduler, SchedulerLimits
from pydantic import BaseModel

from frame_scheduler_priority.scheduler import PriorityScheduler

FRAME_API_VERSION = 1


@hookimpl
def frame_scheduler_create(limits: SchedulerLimits, cache: KVCacheStrategy, options: BaseModel | None) -> Scheduler:
    """A priority scheduler driving ``cache`` (it takes no options)."""
    return PriorityScheduler(limits, cache)
