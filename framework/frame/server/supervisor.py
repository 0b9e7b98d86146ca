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

from frame.engine.mp import AsyncEngine, EngineClient, EngineDeadError

log = logging.getLogger("frame.server")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
#: An engine that ran this long before dying counts as a fresh start: its death begins a new count.
STABLE_S = 60.0
#: Exit status of a server that ends because its engine died.
ENGINE_DEATH_EXIT = 1


class EngineSupervisor:
    """Watches the engine of one app; restarts it or ends the server, per ``policy``."""

    def __init__(self, policy: str, max_restarts: int, start_engine: Callable[[], Awaitable[EngineClient]],
                 replace: Callable[[EngineClient], AsyncEngine], request_exit: Callable[[int], None]) -> None:
        self.policy, self.max_restarts = policy, max_restarts
        self.start_engine, self.replace, self.request_exit = start_engine, replace, request_exit
        self.restarts = 0

    async def watch(self, engine: AsyncEngine) -> None:
        """Run until the server ends: wait for the engine's death, then restart it or end the server."""
        failures = 0
        while True:
            started = time.monotonic()
            await engine.died.wait()
            if self.policy == "exit":
                log.error("engine died; exiting (--on-engine-death exit) so a supervisor can restart the server")
                self.request_exit(ENGINE_DEATH_EXIT)
                return
            if time.monotonic() - started >= STABLE_S:
                failures = 0
            while True:
                if failures >= self.max_restarts:
                    log.error("engine died %d times in a row; giving up (exit status %d)", failures,
                              ENGINE_DEATH_EXIT)
                    self.request_exit(ENGINE_DEATH_EXIT)
                    return
                delay = min(FIRST_BACKOFF_S * 2**failures, MAX_BACKOFF_S)
                failures += 1
                log.warning("engine died; restarting it in %.0f s (restart %d of at most %d in a row)", delay,
                            failures, self.max_restarts)
                await asyncio.sleep(delay)
                try:
                    client = await self.start_engine()
                except EngineDeadError as err:
                    log.error("the new engine failed to start: %s", err)
                    continue
                break
            self.restarts += 1
            log.info("engine restarted (pid %s)", client.pid)
            engine = self.replace(client)
