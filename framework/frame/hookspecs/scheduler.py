"""Hooks of scheduler plugins (entry-point group ``frame.schedulers``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.scheduler import SchedulerLimits, SchedulingPolicy


@hookspec
def frame_scheduler_create(limits: SchedulerLimits, options: BaseModel | None) -> SchedulingPolicy:
    """Create the scheduling policy the engine's scheduler consults under ``limits``.

    Called once by the engine core, on the selected plugin, after the KV pool and the cache strategy exist.
    ``options`` is the plugin's options model instance (``frame_plugin_options``), or None when it has none.
    Return a :class:`~frame.interfaces.scheduler.SchedulingPolicy`: the admission order and the preemption victim;
    the engine owns budgets, chunking, stop rules and freeing. Since API 2 (API 1 returned a whole ``Scheduler``
    built over the cache strategy).
    """
