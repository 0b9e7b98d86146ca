"""The engine process: ``python -m frame.engine.core.proc`` builds an EngineCore and serves it over ZeroMQ.

Started by :class:`~frame.engine.client.mp.MPEngineClient` through :func:`frame.engine.process.spawn`: the
EngineConfig as JSON in its environment, two ipc:// addresses the client bound. It sends :class:`Ready` (or
:class:`Failed`), then runs the :class:`~frame.engine.core.loop.EngineLoop`; it exits when its parent dies.

It runs :func:`~frame.engine.selection.preflight` first, so ``frame serve``'s API process need not import torch
to check the plugins and the model: a mistake there comes back as ``Failed(usage=True)``, one sentence, and the
process exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from frame.engine.process import CONFIG_ENV, ChildSockets, start_child
from frame.engine.wire.client_core import Failed, FromEngine, Ready, ToEngine
from frame.errors import FrameUsageError

if TYPE_CHECKING:
    from frame.config import EngineConfig

log = logging.getLogger("frame.engine.proc")


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="ipc:// address of the request socket")
    parser.add_argument("--output", required=True, help="ipc:// address of the output socket")


def _quietly(check: Callable[[EngineConfig], object], config: EngineConfig) -> None:
    """Run ``check`` with frame's informational lines held back: the build logs them again, and a refusal is
    then its one sentence alone."""
    frame_log = logging.getLogger("frame")
    level = frame_log.level
    frame_log.setLevel(logging.WARNING)
    try:
        check(config)
    finally:
        frame_log.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = start_child("frame-engine", argv, _arguments,
                       lambda _: "%(levelname)s frame-engine[%(process)d]: %(message)s")
    sockets = ChildSockets(args.input, args.output)
    ready = False

    def send(msg: FromEngine) -> None:
        nonlocal ready
        ready = ready or isinstance(msg, Ready)
        sockets.send(msg)

    try:
        from frame.config import EngineConfig
        from frame.engine.core.loop import serve_core
        from frame.engine.selection import preflight

        config = EngineConfig.model_validate_json(os.environ[CONFIG_ENV])
        _quietly(preflight, config)
        serve_core(config, send, partial(sockets.recv_all, ToEngine))
    except Exception as err:  # report any failure to the client before dying
        if isinstance(err, FrameUsageError) and not ready:  # the user's mistake: its sentence is the whole report
            sockets.send(Failed(str(err), usage=True))
            sockets.close()
            return 2
        log.error("engine failed: %s", traceback.format_exc())
        sockets.send(Failed(f"{type(err).__name__}: {err}"))
        sockets.close()
        return 1
    sockets.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
