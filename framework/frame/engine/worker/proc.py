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
import sys
import traceback

from frame.engine.process import CONFIG_ENV, MAX_MODEL_LEN_ENV, ChildSockets, start_child
from frame.engine.wire.core_worker import (
    AllocateKV,
    KVAllocated,
    RunStep,
    StepDone,
    StopWorker,
    ToWorker,
    WorkerFailed,
    WorkerReady,
)

log = logging.getLogger("frame.worker")


def serve(rank: int, world_size: int, init_method: str, sockets: ChildSockets) -> int:
    import torch

    from frame.config import EngineConfig
    from frame.engine.worker.rank import build_rank_worker

    config = EngineConfig.model_validate_json(os.environ[CONFIG_ENV])
    worker = build_rank_worker(config, int(os.environ[MAX_MODEL_LEN_ENV]), rank, world_size, init_method)
    sockets.send(WorkerReady(rank, worker.available_kv_blocks(), worker.runner.bytes_per_block))
    with torch.inference_mode():  # once for the worker's life, not once a step (ModelRunner.execute)
        while True:
            msg = sockets.recv(ToWorker)
            if isinstance(msg, RunStep):
                output = worker.execute(msg.plan)
                if rank == 0:
                    sockets.send(StepDone(output))
            elif isinstance(msg, AllocateKV):
                sockets.send(KVAllocated(rank, worker.allocate_kv(msg.num_blocks)))
            elif isinstance(msg, StopWorker):
                return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True, help="tcp://host:port of the process group's rendezvous")
    parser.add_argument("--inbox", required=True, help="ipc:// address this rank's orders come from")
    parser.add_argument("--outbox", required=True, help="ipc:// address answers go to")


def main(argv: list[str] | None = None) -> int:
    args = start_child("frame-worker", argv, _arguments,
                       lambda a: f"%(levelname)s frame-worker[rank {a.rank}]: %(message)s")
    sockets = ChildSockets(args.inbox, args.outbox)
    try:
        return serve(args.rank, args.world_size, args.init_method, sockets)
    except Exception as err:  # report any failure to the executor before dying
        log.error("worker failed: %s", traceback.format_exc())
        sockets.send(WorkerFailed(args.rank, f"{type(err).__name__}: {err}"))
        return 1
    finally:
        sockets.close()


if __name__ == "__main__":
    sys.exit(main())
