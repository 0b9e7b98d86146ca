"""The engine process: ``python -m frame.engine.core.proc`` builds an EngineCore and serves it over ZeroMQ.

The parent passes only plain data: the EngineConfig as JSON (environment variable ``FRAME_ENGINE_CONFIG``) and
two ipc:// addresses it has bound. The child connects a PULL socket for requests and a PUSH socket for outputs,
sends :class:`Ready` (or :class:`Failed`), then runs the :class:`EngineLoop`. It exits when its parent dies
(``PR_SET_PDEATHSIG`` where Linux offers it, and a thread that watches ``os.getppid()`` everywhere).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback

import zmq

from frame.engine.wire.client_core import Failed, FromEngine, ToEngine, decode_to_engine, encode
from frame.parent_watch import watch_parent

CONFIG_ENV = "FRAME_ENGINE_CONFIG"

log = logging.getLogger("frame.engine.proc")


class _Sockets:
    """The child's two sockets: requests in (PULL), outputs out (PUSH)."""

    def __init__(self, input_addr: str, output_addr: str) -> None:
        self.ctx = zmq.Context()
        self.inp = self.ctx.socket(zmq.PULL)
        self.inp.connect(input_addr)
        self.out = self.ctx.socket(zmq.PUSH)
        self.out.setsockopt(zmq.LINGER, 2000)
        self.out.connect(output_addr)

    def send(self, msg: FromEngine) -> None:
        self.out.send(encode(msg))

    def recv(self, timeout_s: float) -> list[ToEngine]:
        msgs: list[ToEngine] = []
        if self.inp.poll(int(timeout_s * 1000)):
            while True:
                try:
                    msgs.append(decode_to_engine(self.inp.recv(zmq.NOBLOCK)))
                except zmq.Again:
                    break
        return msgs

    def close(self) -> None:
        self.inp.close(linger=0)
        self.out.close()
        self.ctx.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frame-engine")
    parser.add_argument("--input", required=True, help="ipc:// address of the request socket")
    parser.add_argument("--output", required=True, help="ipc:// address of the output socket")
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s frame-engine[%(process)d]: %(message)s")
    watch_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the server shuts us down
    sockets = _Sockets(args.input, args.output)
    try:
        from frame.config import EngineConfig
        from frame.engine.core.loop import serve_core

        serve_core(EngineConfig.model_validate_json(os.environ[CONFIG_ENV]), sockets.send, sockets.recv)
    except Exception as err:  # report any failure to the client before dying
        log.error("engine failed: %s", traceback.format_exc())
        sockets.send(Failed(f"{type(err).__name__}: {err}"))
        sockets.close()
        return 1
    sockets.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
