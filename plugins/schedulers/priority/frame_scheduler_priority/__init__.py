"""frame's priority scheduler plugin (``--sched priority``)."""

from frame_scheduler_priority.scheduler import PriorityScheduler

__all__ = ["PriorityScheduler"]
