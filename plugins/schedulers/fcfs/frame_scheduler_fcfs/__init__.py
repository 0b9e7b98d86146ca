"""frame's first-come-first-served scheduler plugin (``--sched fcfs``)."""

from frame_scheduler_fcfs.scheduler import FcfsScheduler

__all__ = ["FcfsScheduler"]
