"""Hook implementations of the priority scheduler plugin."""

from __future__ import annotations

from frame.hookspecs import hookimpl
from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy
from pydantic import BaseModel

from frame_scheduler_priority.scheduler import PriorityPolicy

FRAME_API_VERSION = 2


@hookimpl
def frame_scheduler_create(limits: SchedulerLimits, options: BaseModel | None) -> SchedulingPolicy:
    """The priority policy (it takes no options)."""
    return PriorityPolicy(limits)
