"""EngineSupervisor: what the server does when its engine dies (a crash, an OOM kill, SIGKILL).

Every open request has already ended with its error by then (AsyncEngine fails them all). With
``--on-engine-death restart`` the supervisor starts a new engine after a back-off (1 s, 2 s, 4 s, ... up to
30 s) while ``/health`` answers 503 and new requests get 503 with Retry-After; after ``max_restarts`` deaths in a
row (an engine that ran for a minute resets the count) it gives up and ends the server with status 1. With
``exit`` it ends the server at once with status 1, so a supervisor outside (systemd, Kubernetes) restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from frame.engine.client import AsyncEngine, EngineClient, EngineDeadError
from frame.engine.client.data_parallel import DataParallelClient

log = logging.getLogger("frame.server")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
#: An engine that ran this long before dying counts as a fresh start: its death begins a new count.
STABLE_S = 60.0
#: Exit status of a server that ends because its engine died.
ENGINE_DEATH_EXIT = 1

T = TypeVar("T")


class EngineSupervisor:
    """Watches the engine of one app; restarts it or ends the server, per ``policy``. With several engine cores
    (data parallelism) each rank is watched on its own: a dead rank is restarted (or ends the server) while the
    others keep serving, with the same back-off and the same count of deaths in a row, per rank."""

    def __init__(self, policy: str, max_restarts: int, start_engine: Callable[[], Awaitable[EngineClient]],
                 replace: Callable[[EngineClient], AsyncEngine], request_exit: Callable[[int], None],
                 on_restart: Callable[[], None] = lambda: None) -> None:
        self.policy, self.max_restarts = policy, max_restarts
        self.start_engine, self.replace, self.request_exit = start_engine, replace, request_exit
        self.on_restart = on_restart
        self.restarts = 0
        self._failures: dict[str, int] = {}

    async def watch(self, engine: AsyncEngine) -> None:
        """Run until the server ends: wait for the engine's death, then restart it or end the server."""
        if isinstance(engine.client, DataParallelClient):
            await self.watch_ranks(engine.client)
            return
        while True:
            started = time.monotonic()
            await engine.died.wait()
            client = await self._restart("engine", started, self.start_engine)
            if client is None:
                return
            engine = self.replace(client)

    async def watch_ranks(self, client: DataParallelClient) -> None:
        """Watch every rank of a data-parallel client until the server ends."""
        await asyncio.gather(*(self._watch_rank(client, slot.rank) for slot in client.slots))

    async def _watch_rank(self, client: DataParallelClient, rank: int) -> None:
        while True:
            started = time.monotonic()
            await client.wait_rank_death(rank)
            if await self._restart(f"engine core rank {rank}", started, lambda: client.restart_rank(rank)) is None:
                return

    async def _restart(self, what: str, started: float, start: Callable[[], Awaitable[T]]) -> T | None:
        """After ``what`` died (it had run since ``started``): start it again with back-off, or end the server
        (None). Deaths in a row are counted per ``what``; one that ran for a minute starts a new count."""
        if self.policy == "exit":
            log.error("%s died; exiting (--on-engine-death exit) so a supervisor can restart the server", what)
            self.request_exit(ENGINE_DEATH_EXIT)
            return None
        failures = self._failures.get(what, 0) if time.monotonic() - started < STABLE_S else 0
        while True:
            if failures >= self.max_restarts:
                log.error("%s died %d times in a row; giving up (exit status %d)", what, failures, ENGINE_DEATH_EXIT)
                self.request_exit(ENGINE_DEATH_EXIT)
                return None
            delay = min(FIRST_BACKOFF_S * 2**failures, MAX_BACKOFF_S)
            failures += 1
            self._failures[what] = failures
            log.warning("%s died; restarting it in %.0f s (restart %d of at most %d in a row)", what, delay,
                        failures, self.max_restarts)
            await asyncio.sleep(delay)
            try:
                result = await start()
            except EngineDeadError as err:
                log.error("%s failed to start again: %s", what, err)
                continue
            self.restarts += 1
            self.on_restart()
            log.info("%s restarted", what)
            return result
