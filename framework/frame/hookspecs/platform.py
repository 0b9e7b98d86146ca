"""Hooks of platform plugins (entry-point group ``frame.platforms``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from frame.hookspecs import hookspec

if TYPE_CHECKING:
    from frame.interfaces.platform import Platform


@hookspec
def frame_platform_check() -> str | None:
    """Whether this platform's device is present on this machine.

    Called on every installed platform plugin by ``frame plugins`` and by ``--platform auto``, before any
    platform is created; must be cheap and must not allocate device memory. Returns None when the platform can
    run here, otherwise one sentence saying why not (``"no CUDA device is visible to torch"``). Since API 1.
    """


@hookspec
def frame_platform_priority() -> int:
    """This platform's rank for ``--platform auto``: among the platforms whose check passes, the highest wins.

    Called on every installed platform plugin during auto-selection. Accelerators return more than the CPU
    (the ``cpu`` plugin returns 0). Since API 1.
    """


@hookspec
def frame_platform_create(options: BaseModel | None) -> Platform:
    """Create the platform object for this run.

    Called once, on the selected plugin, after its check passed and before the model is built. ``options`` is
    the validated instance of the plugin's options model (None if it has none). Since API 1.
    """
