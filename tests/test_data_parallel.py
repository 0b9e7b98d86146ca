"""The data-parallel client and its supervisor over fake engine cores: routing, load, a rank's death and restart.

The cores here are engine clients whose replies the test writes, so every branch runs in milliseconds; the real
cores (child processes, Ray actors) are driven through `frame serve` in tests/server/test_data_parallel*.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from frame.config import build_config
from frame.engine.client import AsyncEngine, EngineClient, EngineDeadError
from frame.engine.client.data_parallel import DataParallelClient, sum_stats
from frame.engine.client.ranks import LoadTracker
from frame.engine.wire.client_core import AddRequests, CoreLoad, Outputs, Ready, ToEngine
from frame.engine.wire.requests import EngineOutput, EngineRequest, EngineStats
from frame.errors import ConfigError
from frame.interfaces.router import RankLoad, Router, RouteRequest
from frame.sampling_params import SamplingParams
from frame.server import supervisor as supervision
from frame.server.supervisor import EngineSupervisor


class FakeCore(EngineClient):
    """An engine client whose core is the test: it keeps what it is sent and answers when told."""

    mode = "fake"
    started = 0

    def __init__(self) -> None:
        super().__init__()
        FakeCore.started += 1
        self.number = FakeCore.started
        self.sent: list[ToEngine] = []

    async def _launch(self) -> None:
        self._dispatch(Ready(pid=1000 + self.number, max_model_len=256, vocab_size=100, num_blocks=8,
                             model_name="fake"))

    def _send(self, msg: ToEngine) -> None:
        self.sent.append(msg)

    async def stats(self, timeout_s: float = 5.0) -> EngineStats:
        return EngineStats(num_blocks=8, blocks_in_use=self.number, steps=10 * self.number)

    async def shutdown(self) -> None:
        self.dead_reason = self.dead_reason or "shut down"

    def added(self) -> list[str]:
        return [r.request_id for m in self.sent if isinstance(m, AddRequests) for r in m.requests]


class SpyRouter(Router):
    """Sends each request to the lowest live rank it is offered, remembering what it saw."""

    def __init__(self, num_ranks: int) -> None:
        super().__init__(num_ranks)
        self.offered: list[list[RankLoad]] = []
        self.resets: list[int] = []

    def route(self, request: RouteRequest, ranks: Sequence[RankLoad]) -> int:
        self.offered.append(list(ranks))
        return ranks[0].rank

    def rank_reset(self, rank: int) -> None:
        self.resets.append(rank)


def request(rid: str, prompt_len: int = 10, max_tokens: int = 5) -> EngineRequest:
    return EngineRequest(request_id=rid, prompt_token_ids=list(range(1, prompt_len + 1)), arrival_time=0.0,
                         params=SamplingParams(max_tokens=max_tokens))


def finished(rid: str) -> EngineOutput:
    return EngineOutput(request_id=rid, new_token_ids=[7], finish_reason="length")


async def started_client(ranks: int = 2) -> tuple[DataParallelClient, list[FakeCore], SpyRouter]:
    cores: list[FakeCore] = []

    def make(config, previous):
        cores.append(FakeCore())
        return cores[-1]

    router = SpyRouter(ranks)
    client = DataParallelClient(build_config(data_parallel_size=ranks), make, router)
    await client.start()
    return client, cores, router


def test_each_prompt_goes_whole_to_the_routed_rank_and_loads_count_unreported_sends() -> None:
    async def run() -> None:
        client, cores, router = await started_client()
        client.add([request("a-0"), request("a-1")])  # one prompt, n=2: one decision, both sequences
        assert cores[0].added() == ["a-0", "a-1"] and len(router.offered) == 1
        client.add([request("b-0", prompt_len=20, max_tokens=4)])
        assert router.offered[-1][0] == RankLoad(0, num_requests=2, num_tokens=30)  # sent, not yet reported
        cores[0]._dispatch(Outputs([], CoreLoad(received=2, num_requests=2, num_tokens=9)))
        client.add([request("c-0")])
        assert router.offered[-1][0] == RankLoad(0, num_requests=3, num_tokens=9 + 24)  # b-0 is not reported yet
        assert client.rank_of("a-1") == 0
        cores[0]._dispatch(Outputs([finished("a-0"), finished("a-1")]))
        assert client.rank_of("a-1") is None and client.rank_states()[0].routed == 3
        await client.shutdown()

    asyncio.run(run())


def test_a_dead_rank_loses_only_its_requests_and_the_router_stops_seeing_it_until_restarted() -> None:
    async def run() -> None:
        client, cores, router = await started_client()
        lost: list[tuple[list[str], str]] = []
        client.on_lost = lambda ids, reason: lost.append((ids, reason))
        router.route = lambda req, ranks: ranks[-1].rank  # type: ignore[method-assign]
        client.add([request("x-0")])
        assert cores[1].added() == ["x-0"]
        cores[1]._die("the engine process 1002 exited with code -9")
        assert lost == [(["x-0"], "engine core rank 1 died (the engine process 1002 exited with code -9)")]
        assert [s.status for s in client.rank_states()] == ["ok", "down"] and client.healthy
        assert router.resets == [1]
        client.add([request("y-0")])
        assert cores[0].added() == ["y-0"]  # the only live rank
        assert (await client.rank_stats()).keys() == {0}
        await client.restart_rank(1)
        assert [s.status for s in client.rank_states()] == ["ok", "ok"] and len(cores) == 3
        client.add([request("z-0")])
        assert cores[2].added() == ["z-0"]
        cores[1]._dispatch(Outputs([finished("x-0")]))  # a late word from the dead core is ignored
        assert client.rank_of("z-0") == 1
        await client.shutdown()

    asyncio.run(run())


def test_with_every_rank_down_new_requests_are_refused_naming_each_rank() -> None:
    async def run() -> None:
        client, cores, _ = await started_client()
        for core in cores:
            core._die("gone")
        assert not client.healthy and client.dead_reason is None
        with pytest.raises(EngineDeadError, match=r"no engine core is serving: rank 0 \(down: gone\); rank 1"):
            client.add([request("a-0")])
        await client.shutdown()

    asyncio.run(run())


def test_the_async_engine_fails_only_the_lost_requests() -> None:
    async def run() -> None:
        client, _, _ = await started_client()
        engine = AsyncEngine(client, tokenizer=None)
        engine.processor.add("keep", None, [1, 2], SamplingParams(max_tokens=3), 0.0)
        engine._queues["keep"] = asyncio.Queue()
        engine.processor.add("lose", None, [1, 2], SamplingParams(max_tokens=3), 0.0)
        queue = engine._queues["lose"] = asyncio.Queue()
        client.on_lost(["lose-0"], "engine core rank 1 died (killed)")  # type: ignore[misc]
        error = queue.get_nowait()
        assert isinstance(error, EngineDeadError) and "rank 1 died" in str(error)
        assert set(engine._queues) == {"keep"} and not engine.died.is_set()
        await client.shutdown()

    asyncio.run(run())


def test_the_supervisor_restarts_a_dead_rank_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervision, "FIRST_BACKOFF_S", 0.01)

    async def run() -> None:
        client, cores, _ = await started_client()
        restarts: list[int] = []
        exits: list[int] = []
        supervisor = EngineSupervisor("restart", 3, lambda: None, lambda c: None, exits.append,  # type: ignore
                                      lambda: restarts.append(1))
        watcher = asyncio.create_task(supervisor.watch_ranks(client))
        await asyncio.sleep(0)
        cores[0]._die("killed")
        for _ in range(100):
            await asyncio.sleep(0.01)
            if restarts:
                break
        assert restarts == [1] and [s.status for s in client.rank_states()] == ["ok", "ok"] and not exits
        watcher.cancel()
        await client.shutdown()

    asyncio.run(run())


def test_the_exit_policy_ends_the_server_when_one_rank_dies() -> None:
    async def run() -> None:
        client, cores, _ = await started_client()
        exits: list[int] = []
        supervisor = EngineSupervisor("exit", 3, lambda: None, lambda c: None, exits.append)  # type: ignore
        watcher = asyncio.create_task(supervisor.watch_ranks(client))
        await asyncio.sleep(0)
        cores[1]._die("killed")
        await asyncio.sleep(0.05)
        assert exits == [1]
        watcher.cancel()
        await client.shutdown()

    asyncio.run(run())


def test_load_reports_cover_the_sends_they_count() -> None:
    load = LoadTracker(3)
    for tokens in (10, 20, 30):
        load.sent_sequence(tokens)
    assert load.current() == RankLoad(3, 3, 60)
    load.reported(CoreLoad(received=1, num_requests=1, num_tokens=4))
    assert load.current() == RankLoad(3, 3, 4 + 20 + 30)
    load.reported(CoreLoad(received=3, num_requests=0, num_tokens=0))
    assert load.current() == RankLoad(3, 0, 0)


def test_stats_of_several_cores_add_up() -> None:
    total = sum_stats([EngineStats(num_blocks=8, blocks_in_use=2, steps=3, prefix_hit_tokens=5),
                       EngineStats(num_blocks=8, blocks_in_use=6, steps=4, prefix_hit_tokens=1)])
    assert (total.num_blocks, total.blocks_in_use, total.steps, total.prefix_hit_tokens) == (16, 8, 7, 6)
    assert total.kv_usage == 0.5


def test_a_rank_past_the_size_is_refused_in_one_sentence() -> None:
    with pytest.raises(ConfigError, match=r"data_parallel_rank \(2\) must be below data_parallel_size \(2\)"):
        build_config(data_parallel_size=2, data_parallel_rank=2)


def test_cores_on_one_host_share_its_devices_and_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from frame.engine.worker.rank import CORES_ON_NODE_ENV, placement_rank

    # Child processes: core d's tensor-parallel rank t is d * tp + t of dp * tp on the host.
    assert placement_rank(build_config(data_parallel_size=2, data_parallel_rank=1)) == (1, 2)
    assert placement_rank(build_config(data_parallel_size=2, data_parallel_rank=1, tensor_parallel_size=2), 1) \
        == (3, 4)
    assert placement_rank(build_config(tensor_parallel_size=2), 1) == (1, 2)
    # Ray actors see only their own devices; the world is every worker of the cores Ray put on the node.
    ray_config = build_config(data_parallel_size=4, data_parallel_rank=3, distributed_backend="ray")
    monkeypatch.delenv(CORES_ON_NODE_ENV, raising=False)
    assert placement_rank(ray_config) == (0, 1)
    monkeypatch.setenv(CORES_ON_NODE_ENV, "2")
    assert placement_rank(ray_config) == (0, 2)
    assert placement_rank(ray_config.model_copy(update={"tensor_parallel_size": 2}), 1) == (1, 4)
