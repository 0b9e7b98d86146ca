"""frame's longest-prefix-match scheduler plugin (``--sched lpm``)."""

from frame_scheduler_lpm.scheduler import LpmOptions, LpmPolicy

__all__ = ["LpmOptions", "LpmPolicy"]
