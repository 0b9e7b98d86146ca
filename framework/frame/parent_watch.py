"""Child processes end with their parent: the engine core, TP workers and chat-template workers all call
:func:`watch_parent` first.

This module imports nothing of frame's, so a light child (the render worker) does not pay for torch or transformers
just to watch its parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit this process as soon as ``parent_pid`` is no longer its parent."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    def poll() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(interval_s)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=poll, name="parent-watch", daemon=True).start()
