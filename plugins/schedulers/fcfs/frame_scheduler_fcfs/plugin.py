"""Hook implementations of the fcfs scheduler plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from pydantic import BaseModel

from frame_scheduler_fcfs.scheduler import FcfsPolicy

FRAME_API_VERSION = 2


@hookimpl
def frame_scheduler_create(limits: SchedulerLimits, options: BaseModel | None) -> SchedulingPolicy:
    """The first-come-first-served policy (it takes no options)."""
    return FcfsPolicy(limits)
