"""Every child process the engine starts, from both ends: one launcher, one child start-up, one socket pair.

A parent starts a child with :func:`spawn`: ``python -m <module> ... --parent-pid <pid>``, the EngineConfig as JSON
in the child's environment (:data:`CONFIG_ENV`), addresses as arguments: plain data, never pickle. A child begins
with :func:`start_child` (its arguments, its log format, SIGINT left to the parent, and :func:`watch_parent`, so it
ends with its parent) and talks over :class:`ChildSockets` (orders in on a PULL socket, answers out on a PUSH
socket, both through the wire codec). The engine core's process and the tensor-parallel workers' use all three;
the API server's chat-template workers and its constraint worker start through :func:`spawn_piped` and talk over
their pipes (frames of the same codec), beginning with :func:`watch_parent`. Ray actors are placed through
placement groups instead: a placement the cluster cannot hold is refused at once (:func:`check_fits`), one that
stays unmet fails after :data:`PLACEMENT_TIMEOUT_S` (:func:`wait_placed`), each naming the resources asked for and
those Ray has.

Imports nothing heavy (no torch, no transformers): a light child does not pay for them to watch its parent.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import zmq

from frame.engine.wire.codec import decode, encode, encode_frame, read_frame
from frame.errors import ConfigError

if TYPE_CHECKING:
    from frame.config import EngineConfig

T = TypeVar("T")

#: The EngineConfig, as JSON, in a child's environment.
CONFIG_ENV = "FRAME_ENGINE_CONFIG"
#: The context length the engine core resolved, for its worker processes.
MAX_MODEL_LEN_ENV = "FRAME_MAX_MODEL_LEN"
#: How many data-parallel engine cores share this host (each takes its share of the cores).
CORES_ON_NODE_ENV = "FRAME_CORES_ON_NODE"
#: The Ray placement group an engine-core actor places its tensor-parallel workers in.
PLACEMENT_GROUP_ENV = "FRAME_RAY_PLACEMENT_GROUP"

_PR_SET_PDEATHSIG = 1


def spawn(module: str, args: list[str], env: dict[str, str], stdin: int | None = subprocess.DEVNULL,
          ) -> subprocess.Popen[bytes]:
    """Start ``python -m module *args --parent-pid <this process>`` with ``env`` added to this environment."""
    return subprocess.Popen([sys.executable, "-m", module, *args, "--parent-pid", str(os.getpid())],
                            env={**os.environ, **env}, stdin=stdin)


async def spawn_piped(module: str, args: list[str]) -> asyncio.subprocess.Process:
    """:func:`spawn` for an asyncio caller whose child talks over its stdin and stdout (the chat-template and
    constraint workers): ``python -m module *args --parent-pid <this process>`` with both pipes open."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, "--parent-pid", str(os.getpid()),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)


def serve_piped(prog: str, argv: list[str] | None, incoming: Any,
                start: Callable[[Any], tuple[Any, Callable[[Any], Any]]]) -> int:
    """The child side of :func:`spawn_piped`: its arguments (``--parent-pid``), stdout kept for frames alone (stray
    prints go to stderr, the log), the parent watch, then frames of ``incoming`` (a tagged union) on stdin.
    ``start(first message)`` returns the ready answer and the handler of every later message (whose answer goes
    back; None: none); it may raise SystemExit for a first message of the wrong kind. Returns at end of input.
    SIGINT and SIGTERM are ignored: the worker ends with its input, a SIGKILL from its owner, or its parent."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    inp = sys.stdin.buffer
    watch_parent(args.parent_pid)
    # A Ctrl-C or a SIGTERM sent to the whole process group is the parent's to handle: it closes its pool and
    # kills its workers itself. Dying first would read, in the parent, as a worker killed from outside.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    data = read_frame(inp)
    if data is None:
        return 0
    ready, handle = start(decode(data, incoming))
    out.write(encode_frame(ready))
    while (data := read_frame(inp)) is not None:
        answer = handle(decode(data, incoming))
        if answer is not None:
            out.write(encode_frame(answer))
    return 0


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for the process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ray_address(config: EngineConfig) -> str:
    """Where to find Ray: ``ray_address`` ('auto': the cluster ``ray start`` made on this machine), else
    ``$RAY_ADDRESS``, else a new local Ray of this process's own ("local"; never a cluster that merely happens to
    run on this machine, which a bare ``ray.init()`` would join)."""
    return config.ray_address or os.environ.get("RAY_ADDRESS") or "local"


def start_child(prog: str, argv: list[str] | None, add_arguments: Callable[[argparse.ArgumentParser], None],
                log_format: Callable[[argparse.Namespace], str]) -> argparse.Namespace:
    """A spawned child's first lines: its arguments (with ``--parent-pid``), its log format, SIGINT ignored (a
    Ctrl-C reaches the whole process group and the parent stops its children), and the parent watch."""
    parser = argparse.ArgumentParser(prog=prog)
    add_arguments(parser)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=log_format(args))
    watch_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return args


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Exit this process as soon as ``parent_pid`` is no longer its parent (``PR_SET_PDEATHSIG`` where Linux
    offers it, and a thread that watches ``os.getppid()`` everywhere)."""
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


class ChildSockets:
    """A child's two sockets, connected to addresses its parent bound: orders in (PULL), answers out (PUSH)."""

    def __init__(self, inbox: str, outbox: str) -> None:
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.connect(inbox)
        self.outbox = self.ctx.socket(zmq.PUSH)
        self.outbox.setsockopt(zmq.LINGER, 2000)  # a last answer (a failure) still leaves before exit
        self.outbox.connect(outbox)

    def send(self, msg: Any) -> None:
        self.outbox.send(encode(msg))

    def recv(self, kind: type[T]) -> T:
        """The next order, waiting as long as it takes."""
        return decode(self.inbox.recv(), kind)

    def recv_all(self, kind: type[T], timeout_s: float) -> list[T]:
        """Every order that arrives within ``timeout_s`` of the first (none when nothing came in time)."""
        msgs: list[T] = []
        if self.inbox.poll(int(timeout_s * 1000)):
            while True:
                try:
                    msgs.append(decode(self.inbox.recv(zmq.NOBLOCK), kind))
                except zmq.Again:
                    break
        return msgs

    def close(self) -> None:
        self.inbox.close(linger=0)
        self.outbox.close()
        self.ctx.term()


#: How long Ray may take to place a placement group before the start fails naming what it asked for: placing
#: takes seconds where the resources exist, and waiting longer only hides a request the cluster cannot meet.
PLACEMENT_TIMEOUT_S = 60.0


def placement_error(ray: Any, bundles: list[dict[str, float]], groups: int,
                    waited_s: float | None = None) -> ConfigError | None:
    """One sentence naming the resources ``groups`` placement groups of ``bundles`` ask for and what Ray has: when
    the cluster's total cannot hold them (``waited_s`` None: nothing to wait for), or after ``waited_s`` seconds of
    waiting for free ones. None when the total holds them and nothing was waited for."""
    asked: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            asked[name] = asked.get(name, 0.0) + amount * groups
    have = {name: ray.cluster_resources().get(name, 0.0) for name in asked}
    if waited_s is None and all(asked[name] <= have[name] for name in asked):
        return None
    free = {name: ray.available_resources().get(name, 0.0) for name in asked}

    def show(amounts: dict[str, float]) -> str:
        return ", ".join(f"{amount:g} {name}" for name, amount in sorted(amounts.items()))

    when = f" in {waited_s:.0f} s" if waited_s is not None else ""
    return ConfigError(
        f"Ray cannot place {groups} placement group(s) of {bundles}{when}: they ask for {show(asked)} in all, and "
        f"the Ray cluster has {show(have)} ({show(free)} free); lower --data-parallel-size or "
        "--tensor-parallel-size, or add nodes to the cluster.", param="data_parallel_size")


def check_fits(ray: Any, bundles: list[dict[str, float]], groups: int) -> None:
    """Before any group is made: a :func:`placement_error` when the cluster's total cannot hold them (as vLLM
    refuses more GPUs than the cluster has), rather than a wait for resources that no node has."""
    too_many = placement_error(ray, bundles, groups)
    if too_many is not None:
        raise too_many


async def wait_placed(ray: Any, groups: list[Any], bundles: list[dict[str, float]]) -> None:
    """Wait until Ray placed every group; a :func:`placement_error` when its resources stay taken for
    :data:`PLACEMENT_TIMEOUT_S`."""
    import asyncio

    try:
        await asyncio.wait_for(asyncio.gather(*(group.ready() for group in groups)), PLACEMENT_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise placement_error(ray, bundles, len(groups), PLACEMENT_TIMEOUT_S) from None
