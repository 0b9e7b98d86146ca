"""RayExecutor: the model workers as Ray actors, one per tensor-parallel rank, in one placement group.

Ray places the actors (on this machine or across a cluster) and carries the calls; frame adds no cluster manager
or transport of its own. Everything that crosses is msgpack bytes of frame's msgspec messages, never a pickled
frame object. Rank 0's actor names the rendezvous (its node's address and a free port), then every actor joins
the torch.distributed group and builds its shard. A step calls every actor with the plan's bytes and waits for
all of them, polling, so an actor that dies (``ray.kill``, a lost node) fails the step with
:class:`~frame.engine.core.executor.base.WorkerDiedError` instead of leaving the others blocked in a collective.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from frame.config import EngineConfig
from frame.engine.core.executor.base import Executor, WorkerDiedError
from frame.engine.process import (
    PLACEMENT_GROUP_ENV,
    PLACEMENT_TIMEOUT_S,
    check_fits,
    free_tcp_port,
    placement_error,
    ray_address,
)
from frame.engine.wire.codec import decode, encode
from frame.engine.wire.core_worker import FromWorker, KVAllocated, StepDone, WorkerReady
from frame.engine.wire.plan import RunnerOutput, SchedulerOutput

log = logging.getLogger("frame.executor.ray")

POLL_S = 0.1
BLAME_GRACE_S = 2.0  # how long the other ranks get to report an actor death before a survivor is blamed
START_TIMEOUT_S = 900.0
class RayRankWorker:
    """The body of one rank's actor (wrapped by ``ray.remote`` when the executor starts)."""

    def __init__(self, config_json: str, max_model_len: int, rank: int, world_size: int) -> None:
        self.args = (config_json, max_model_len, rank, world_size)
        self.worker: Any = None

    def rendezvous_address(self) -> str:
        """``tcp://ip:port`` on this actor's node, for rank 0 to host the process group."""
        import ray


        ip = ray.util.get_node_ip_address()
        return f"tcp://{ip}:{free_tcp_port('0.0.0.0')}"

    def build(self, init_method: str) -> bytes:
        from frame.engine.worker.rank import build_rank_worker

        config_json, max_model_len, rank, world_size = self.args
        config = EngineConfig.model_validate_json(config_json)
        self.worker = build_rank_worker(config, max_model_len, rank, world_size, init_method)
        return encode(WorkerReady(rank, self.worker.available_kv_blocks(), self.worker.runner.bytes_per_block))

    def allocate_kv(self, num_blocks: int) -> bytes:
        return encode(KVAllocated(self.worker.rank, self.worker.allocate_kv(num_blocks)))

    def execute(self, plan: bytes) -> bytes | None:
        output = self.worker.execute(decode(plan, SchedulerOutput))
        return encode(StepDone(output)) if self.worker.rank == 0 else None


class RayExecutor(Executor):
    """Starts (or joins, with ``ray_address``) Ray, places one actor per rank and builds the model on each."""

    def __init__(self, config: EngineConfig, max_model_len: int, world_size: int, platform: str = "cpu") -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self.world_size = world_size
        if not ray.is_initialized():
            ray.init(address=ray_address(config), include_dashboard=False, log_to_driver=True,
                     ignore_reinit_error=True)
        resource = {"GPU": 1} if platform in ("cuda", "rocm") else {"CPU": 1}
        # An engine core that is itself a Ray actor (data parallelism) was given a placement group whose bundles
        # after its own are for its workers; otherwise one bundle per rank, packed on as few nodes as possible:
        # tensor parallelism is chatty.
        given = os.environ.get(PLACEMENT_GROUP_ENV)
        if not given:
            check_fits(ray, [resource] * world_size, 1)
        self._owns_group = not given
        self._first_bundle = 1 if given else 0
        self._group = (ray.util.get_placement_group(given) if given
                       else placement_group([dict(resource) for _ in range(world_size)], strategy="PACK"))
        self._actors: list[Any] = []
        self._closed = False
        try:
            self._wait_placed()
            actor_class = ray.remote(num_cpus=resource.get("CPU", 0), num_gpus=resource.get("GPU", 0))(RayRankWorker)
            for rank in range(world_size):
                strategy = PlacementGroupSchedulingStrategy(placement_group=self._group,
                                                            placement_group_bundle_index=self._first_bundle + rank)
                self._actors.append(actor_class.options(scheduling_strategy=strategy).remote(
                    config.model_dump_json(), max_model_len, rank, world_size))
            init_method = ray.get(self._actors[0].rendezvous_address.remote(), timeout=START_TIMEOUT_S)
            ready = [decode(b, FromWorker) for b in self._wait([a.build.remote(init_method) for a in self._actors],
                                                                START_TIMEOUT_S)]
        except BaseException:
            self.shutdown()
            raise
        assert all(isinstance(msg, WorkerReady) for msg in ready)
        self._kv_blocks = min(msg.kv_blocks for msg in ready)  # type: ignore[union-attr]
        self._bytes_per_block = ready[0].bytes_per_block  # type: ignore[union-attr]

    def _wait_placed(self) -> None:
        try:
            self._ray.get(self._group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except self._ray.exceptions.GetTimeoutError:
            raise placement_error(self._ray, self._group.bundle_specs, 1, PLACEMENT_TIMEOUT_S) from None

    def available_kv_blocks(self) -> int:
        return self._kv_blocks

    def allocate_kv(self, num_blocks: int) -> list[int]:
        answers = self._wait([a.allocate_kv.remote(num_blocks) for a in self._actors], START_TIMEOUT_S)
        driver = decode(answers[0], FromWorker)
        return driver.decode_graphs if isinstance(driver, KVAllocated) else []

    def execute(self, plan: SchedulerOutput) -> RunnerOutput:
        data = encode(plan)
        results = self._wait([a.execute.remote(data) for a in self._actors], None)
        done = decode(results[0], FromWorker)
        assert isinstance(done, StepDone)
        return done.output

    def check_health(self) -> None:
        if self._closed:
            raise WorkerDiedError("the Ray workers were stopped")

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for actor in self._actors:
            try:
                self._ray.kill(actor)
            except Exception:  # an actor that is already gone
                log.debug("actor already gone", exc_info=True)
        if not self._owns_group:
            return
        try:
            self._ray.util.remove_placement_group(self._group)
        except Exception:
            log.debug("placement group already gone", exc_info=True)

    @property
    def bytes_per_block(self) -> int:
        return self._bytes_per_block

    def _wait(self, refs: list[Any], timeout_s: float | None) -> list[Any]:
        """Every call's result, in order; any failed or lost actor stops all of them and raises WorkerDiedError."""
        ray = self._ray
        pending, waited = list(refs), 0.0
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            failed = [(ref, err) for ref in done if (err := self._error_of(ref)) is not None]
            if failed:
                rank, err = self._blame(refs, *failed[0])
                self.shutdown()
                raise WorkerDiedError(f"the model worker of rank {rank} failed: {type(err).__name__}: "
                                      f"{str(err).splitlines()[0] if str(err) else ''}") from None
            waited += POLL_S
            if timeout_s is not None and pending and waited > timeout_s:
                self.shutdown()
                raise WorkerDiedError(f"the Ray workers did not answer within {timeout_s:.0f} s")
        return ray.get(refs)

    def _error_of(self, ref: Any) -> BaseException | None:
        try:
            self._ray.get(ref, timeout=0)
        except Exception as err:  # any failure of a call is its worker's failure
            return err
        return None

    def _blame(self, refs: list[Any], first_failed: Any, first_err: BaseException) -> tuple[int, BaseException]:
        """The rank whose actor died, not a survivor whose collective broke because of it: the survivor's error
        often arrives first, so the other calls get a moment to report an actor death."""
        actor_died = self._ray.exceptions.RayActorError
        if not isinstance(first_err, actor_died):
            self._ray.wait(refs, num_returns=len(refs), timeout=BLAME_GRACE_S)
            for rank, ref in enumerate(refs):
                err = self._error_of(ref) if ref is not first_failed else None
                if isinstance(err, actor_died):
                    return rank, err
        return refs.index(first_failed), first_err
