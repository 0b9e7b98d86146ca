"""One data-parallel rank as the client side sees it: its engine client, its state, its open sequences, its load.

A router needs each core's load at the moment it decides, but a core reports its load only between steps. The
:class:`LoadTracker` therefore adds what was sent to a core after its last report: every report says how many
requests the core had received by then, so the sends it does not cover yet are known exactly.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from frame.config import EngineConfig
from frame.engine.client.base import EngineClient, RankState
from frame.engine.wire.client_core import CoreLoad
from frame.interfaces.router import RankLoad


class LoadTracker:
    """A core's last load report plus the sequences sent to it since (counted at full size)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.reset()

    def reset(self) -> None:
        """A new core (started or restarted): nothing sent, nothing reported."""
        self.sent = 0
        self.report = CoreLoad(0, 0, 0)
        self._unreported: deque[int] = deque()

    def sent_sequence(self, tokens: int) -> None:
        """One sequence was sent to the core; ``tokens``: its prompt plus the output tokens it may produce."""
        self.sent += 1
        self._unreported.append(tokens)

    def reported(self, load: CoreLoad) -> None:
        """The core's report: it covers the first ``load.received`` sequences sent."""
        self.report = load
        while len(self._unreported) > max(0, self.sent - load.received):
            self._unreported.popleft()

    def current(self) -> RankLoad:
        """The load a router sees now."""
        return RankLoad(self.rank, self.report.num_requests + len(self._unreported),
                        self.report.num_tokens + sum(self._unreported))


@dataclass
class RankSlot:
    """One data-parallel rank. ``client`` is None until its first start; ``status`` is ``starting``, ``ok`` or
    ``down``; ``open`` holds the sequence ids it is serving; ``died`` is set when its core dies (a new event
    comes with every start)."""

    rank: int
    config: EngineConfig
    client: EngineClient | None = None
    status: str = "starting"
    reason: str | None = None
    open: dict[str, None] = field(default_factory=dict)
    routed: int = 0
    load: LoadTracker = field(init=False)
    died: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.load = LoadTracker(self.rank)

    @property
    def serving(self) -> bool:
        return self.status == "ok" and self.client is not None and self.client.healthy

    def state(self) -> RankState:
        return RankState(self.rank, self.status, self.client.pid if self.client is not None else None, self.routed)

    def describe(self) -> str:
        """``rank 1 (down: the engine process 123 exited with code -9)``, for error messages."""
        return f"rank {self.rank} ({self.status}{': ' + self.reason if self.reason else ''})"
