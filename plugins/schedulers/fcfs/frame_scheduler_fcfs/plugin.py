"""Hook implementations of the fcfs scheduler plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.cache import KVCacheStrategy
from frame.interfaces.scheduler import Scheduler, SchedulerLimits
from pydantic import BaseModel

from frame_scheduler_fcfs.scheduler import FcfsScheduler

FRAME_API_VERSION = 1


@hookimpl
def frame_scheduler_create(limits: SchedulerLimits, cache: KVCacheStrategy, options: BaseModel | None) -> Scheduler:
    """A first-come-first-served scheduler driving ``cache`` (it takes no options)."""
    return FcfsScheduler(limits, cache)
