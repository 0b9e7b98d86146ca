"""frame's priority scheduler plugin (``--sched priority``)."""

from frame_scheduler_priority.scheduler import PriorityPolicy

__all__ = ["PriorityPolicy"]
