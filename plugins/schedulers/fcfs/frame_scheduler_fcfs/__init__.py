"""frame's first-come-first-served scheduler plugin (``--sched fcfs``)."""

from frame_scheduler_fcfs.scheduler import FcfsPolicy

__all__ = ["FcfsPolicy"]
