"""Engine cores as Ray actors: one actor per data-parallel rank, on this machine or across a Ray cluster.

Each rank gets one placement group: its first bundle holds the engine core's actor (and, without tensor
parallelism, its model), and with ``tensor_parallel_size`` T, T more bundles hold the core's model workers, which
the core's :class:`~frame.engine.core.executor.ray.RayExecutor` places there (the group's name reaches it in the
actor's environment). The group packs a rank onto one node, since tensor parallelism is chatty; ranks go
wherever the cluster has room. Ray places and restarts the actors and carries the calls; what crosses is
msgpack bytes of frame's msgspec messages, as over the child process's sockets, never a pickled frame object.

The actor runs the same :class:`~frame.engine.core.loop.EngineLoop` as a child process, in a thread; the client
sends numbered messages (a threaded actor may run two calls at once, so the actor puts them back in order) and
long-polls for what the core sends back. When the actor dies, a poll fails and the rank's requests end; the actor
is started with ``max_restarts=-1``, so Ray restarts it (its constructor builds a new core) and the next client of
the rank reattaches to it, or starts a fresh actor when Ray will not restart it (``ray.kill`` with its default
``no_restart=True``, a node that is gone for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import threading
from typing import Any

from frame.config import EngineConfig
from frame.engine.client.base import EngineClient
from frame.engine.core.ray_actor import EngineCoreActor
from frame.engine.process import CORES_ON_NODE_ENV, PLACEMENT_GROUP_ENV, check_fits, ray_address, wait_placed
from frame.engine.wire.client_core import FromEngine, Shutdown, ToEngine
from frame.engine.wire.codec import decode, encode

log = logging.getLogger("frame.engine.ray")

POLL_S = 0.5
_GPU_PLATFORMS = ("cuda", "rocm")


class RaySession:
    """The Ray side of one data-parallel client: the connection, its actors' names, a placement group per rank."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.token = secrets.token_hex(4)
        self._groups: dict[int, Any] = {}
        self._cores_on_node: dict[int, int] = {}
        self._placing: asyncio.Task[None] | None = None
        self._generation = 0
        self._bundles: list[dict[str, float]] | None = None
        self._joined = False  # this session called ray.init (and so leaves Ray at close)

    def connect(self) -> Any:
        import ray

        if not ray.is_initialized():
            log.info("joining Ray at %s", ray_address(self.config))
            # ray.init makes SIGTERM exit the driver at once; the server's own handlers (a drain) stay in charge.
            handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
            ray.init(address=ray_address(self.config), include_dashboard=False, log_to_driver=True,
                     ignore_reinit_error=True)
            self._joined = True
            if threading.current_thread() is threading.main_thread():
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)
        return ray

    def bundles(self) -> list[dict[str, float]]:
        """One rank's placement group: the core's bundle, then one per tensor-parallel worker (if any)."""
        if self._bundles is None:
            from frame.engine.selection import select_platform
            from frame.plugins.hooks import PluginHooks
            from frame.plugins.registry import PluginRegistry

            gpu = select_platform(PluginHooks(PluginRegistry()), self.config.platform) in _GPU_PLATFORMS
            tp = self.config.tensor_parallel_size
            worker = {"GPU": 1.0} if gpu else {"CPU": 1.0}
            self._bundles = ([{"CPU": 1.0, **worker}] if tp == 1 and gpu else [{"CPU": 1.0}])
            if tp > 1:
                self._bundles += [dict(worker) for _ in range(tp)]
        return self._bundles

    def _group_name(self, rank: int) -> str:
        return f"frame-{self.token}-rank{rank}"

    async def _place(self) -> None:
        """Every rank's placement group, made together, and how many cores each node got: the cores on one node
        share its CPU cores (a CPU platform gives each its share of the threads, as child processes do)."""
        ray = self.connect()
        from ray.util.placement_group import placement_group

        check_fits(ray, self.bundles(), self.config.data_parallel_size)
        for rank in range(self.config.data_parallel_size):
            self._groups[rank] = placement_group(self.bundles(), strategy="PACK", name=self._group_name(rank))
        await wait_placed(ray, list(self._groups.values()), self.bundles())
        nodes = {rank: ray.util.placement_group_table(group)["bundles_to_node_id"][0]
                 for rank, group in self._groups.items()}
        self._cores_on_node = {rank: sum(n == node for n in nodes.values()) for rank, node in nodes.items()}
        log.info("engine cores placed on %d Ray node(s): %s", len(set(nodes.values())),
                 ", ".join(f"rank {r} on {n[:8]}" for r, n in sorted(nodes.items())))

    async def create_actor(self, config: EngineConfig) -> Any:
        """A new actor for ``config.data_parallel_rank``, in the rank's placement group (all made on first use)."""
        ray = self.connect()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._placing is None:
            self._placing = asyncio.ensure_future(self._place())
        await asyncio.shield(self._placing)
        rank = config.data_parallel_rank
        name = self._group_name(rank)
        group = self._groups[rank]
        core = self.bundles()[0]
        self._generation += 1
        options: dict[str, Any] = {
            "name": f"frame-engine-{self.token}-rank{rank}-{self._generation}", "max_restarts": -1,
            "max_task_retries": 0, "max_concurrency": 4, "num_cpus": core.get("CPU", 0),
            "num_gpus": core.get("GPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=group,
                                                                    placement_group_bundle_index=0),
        }
        env = {CORES_ON_NODE_ENV: str(self._cores_on_node[rank])}  # the core's workers inherit it
        if config.tensor_parallel_size > 1:
            env[PLACEMENT_GROUP_ENV] = name
        options["runtime_env"] = {"env_vars": env}
        return ray.remote(EngineCoreActor).options(**options).remote(config.model_dump_json())

    def client(self, config: EngineConfig, previous: EngineClient | None) -> EngineClient:
        """The rank factory of :class:`~frame.engine.client.data_parallel.DataParallelClient`."""
        return RayEngineClient(self, config, previous if isinstance(previous, RayEngineClient) else None)

    def close(self) -> None:
        """Give the placement groups back (the actors are stopped by their clients) and leave Ray, which stops a
        local Ray this session started (it would outlive a server that exits by its signal)."""
        if not self._joined:
            return
        import ray

        for group in self._groups.values():
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(group)
        self._groups.clear()
        ray.shutdown()
        self._joined = False


class RayEngineClient(EngineClient):
    """One rank's engine core as a Ray actor; reattaches to the actor of ``previous`` after Ray restarted it."""

    mode = "ray"

    def __init__(self, session: RaySession, config: EngineConfig, previous: RayEngineClient | None = None) -> None:
        super().__init__()
        self.session, self.config = session, config
        self.rank = config.data_parallel_rank
        self.actor: Any = previous.actor if previous is not None else None
        self._reattached = self.actor is not None
        self._actor_gone = False  # the actor itself died (not only its loop)
        self._seq = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def _launch(self) -> None:
        if self.actor is None:
            self.actor = await self.session.create_actor(self.config)
        self._tasks = [asyncio.create_task(self._greet(), name=f"ray-rank{self.rank}-ready")]

    async def _greet(self) -> None:
        """Wait for the core's Ready (through a restart, or on a fresh actor if Ray will not restart this one),
        then read its messages until it dies."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        while True:
            try:
                greeting = await self.actor.ready.remote()
                break
            except ActorUnavailableError:  # being restarted: ask again
                await asyncio.sleep(POLL_S)
            except RayActorError as err:
                if not self._reattached:
                    self._die(self._death(err))
                    return
                log.info("the actor of rank %d is gone for good; starting a new one", self.rank)
                self._reattached = False
                self.actor = await self.session.create_actor(self.config)
        self._dispatch(decode(greeting, FromEngine))
        await self._read()

    async def _read(self) -> None:
        from ray.exceptions import RayActorError

        while self.dead_reason is None:
            try:
                batch = await self.actor.poll.remote(POLL_S)
            except RayActorError as err:
                self._actor_gone = True
                self._die(self._death(err))
                return
            for data in batch:
                self._dispatch(decode(data, FromEngine))

    def _death(self, err: BaseException) -> str:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"the engine core actor of rank {self.rank} died ({type(err).__name__}: {first})"

    def _send(self, msg: ToEngine) -> None:
        self._send_encoded(msg, encode(msg))

    def _send_encoded(self, msg: ToEngine, data: bytes) -> None:
        self.actor.send.remote(self._seq, data)
        self._seq += 1

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self.actor is not None and not self._actor_gone:
            import ray

            # A live actor stops for good. One whose core failed (its loop ended, the process lives on) is killed
            # for Ray to restart, so the rank's next client finds a fresh core; a dead one is already Ray's.
            restart = self.dead_reason is not None
            with contextlib.suppress(Exception):
                self._send(Shutdown())
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=not restart)
        if self.dead_reason is None:
            self.dead_reason = "the engine was shut down"
