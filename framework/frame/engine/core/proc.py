"""The engine process: ``python -m frame.engine.core.proc`` builds an EngineCore and serves it over ZeroMQ.

Started by :class:`~frame.engine.client.mp.MPEngineClient` through :func:`frame.engine.process.spawn`: the
EngineConfig as JSON in its environment, two ipc:// addresses the client bound. It sends :class:`Ready` (or
:class:`Failed`), then runs the :class:`~frame.engine.core.loop.EngineLoop`; it exits when its parent dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from functools import partial

from frame.engine.process import CONFIG_ENV, ChildSockets, start_child
from frame.engine.wire.client_core import Failed, ToEngine

log = logging.getLogger("frame.engine.proc")


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="ipc:// address of the request socket")
    parser.add_argument("--output", required=True, help="ipc:// address of the output socket")


def main(argv: list[str] | None = None) -> int:
    args = start_child("frame-engine", argv, _arguments,
                       lambda _: "%(levelname)s frame-engine[%(process)d]: %(message)s")
    sockets = ChildSockets(args.input, args.output)
    try:
        from frame.config import EngineConfig
        from frame.engine.core.loop import serve_core

        serve_core(EngineConfig.model_validate_json(os.environ[CONFIG_ENV]), sockets.send,
                   partial(sockets.recv_all, ToEngine))
    except Exception as err:  # report any failure to the client before dying
        log.error("engine failed: %s", traceback.format_exc())
        sockets.send(Failed(f"{type(err).__name__}: {err}"))
        sockets.close()
        return 1
    sockets.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
