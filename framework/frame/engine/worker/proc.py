"""A model worker in a process of its own: ``python -m frame.engine.worker.proc --rank R ...``.

The executor passes plain data only: the EngineConfig as JSON and the context length in the environment, the
rank, the rendezvous address and two ipc:// addresses as arguments. The worker connects a PULL socket for its
orders and a PUSH socket for its answers, builds its rank (:func:`~frame.engine.worker.rank.build_rank_worker`),
reports :class:`~frame.engine.wire.core_worker.WorkerReady`, then runs steps until told to stop. It exits when
its parent (the engine core's process) dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback

import zmq

from frame.engine.wire.core_worker import (
    AllocateKV,
    KVAllocated,
    RunStep,
    StepDone,
    StopWorker,
    WorkerFailed,
    WorkerReady,
    decode_to_worker,
    encode,
)
from frame.parent_watch import watch_parent

CONFIG_ENV = "FRAME_ENGINE_CONFIG"
MAX_MODEL_LEN_ENV = "FRAME_MAX_MODEL_LEN"

log = logging.getLogger("frame.worker")


def serve(rank: int, world_size: int, init_method: str, inbox: zmq.Socket, outbox: zmq.Socket) -> int:
    from frame.config import EngineConfig
    from frame.engine.worker.rank import build_rank_worker

    config = EngineConfig.model_validate_json(os.environ[CONFIG_ENV])
    worker = build_rank_worker(config, int(os.environ[MAX_MODEL_LEN_ENV]), rank, world_size, init_method)
    outbox.send(encode(WorkerReady(rank, worker.available_kv_blocks(), worker.runner.bytes_per_block)))
    while True:
        msg = decode_to_worker(inbox.recv())
        if isinstance(msg, RunStep):
            output = worker.execute(msg.plan)
            if rank == 0:
                outbox.send(encode(StepDone(output)))
        elif isinstance(msg, AllocateKV):
            worker.allocate_kv(msg.num_blocks)
            outbox.send(encode(KVAllocated(rank)))
        elif isinstance(msg, StopWorker):
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frame-worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True, help="tcp://host:port of the process group's rendezvous")
    parser.add_argument("--inbox", required=True, help="ipc:// address this rank's orders come from")
    parser.add_argument("--outbox", required=True, help="ipc:// address answers go to")
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s frame-worker[rank {args.rank}]: %(message)s")
    watch_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the executor stops us
    ctx = zmq.Context()
    inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inbox.connect(args.inbox)
    outbox.setsockopt(zmq.LINGER, 2000)
    outbox.connect(args.outbox)
    try:
        return serve(args.rank, args.world_size, args.init_method, inbox, outbox)
    except Exception as err:  # report any failure to the executor before dying
        log.error("worker failed: %s", traceback.format_exc())
        outbox.send(encode(WorkerFailed(args.rank, f"{type(err).__name__}: {err}")))
        return 1
    finally:
        inbox.close(linger=0)
        outbox.close()
        ctx.term()


if __name__ == "__main__":
    sys.exit(main())
