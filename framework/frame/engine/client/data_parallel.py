"""DataParallelClient: N engine cores behind one EngineClient, a router plugin placing each request.

Each rank is an ordinary engine client of its own (a child process over ZeroMQ, or a Ray actor), started with
the same config but its own ``data_parallel_rank``. Every request goes, with all its sequences, to the rank the
router (``--router``) picks from the live ranks' loads (:mod:`frame.engine.client.ranks`) and, for routers that
ask, the digests of the prompt's first blocks. Outputs of every rank flow to one ``listener``.

When one core dies, only its own requests end (``on_lost``, with the rank and the cause); the router stops
seeing it, the other ranks keep serving, and :meth:`restart_rank` brings it back (the server's supervisor
decides when, and under Ray the actor itself is restarted by Ray). The client as a whole never dies of one
rank: with every rank down it refuses new requests until one is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from frame.config import EngineConfig, resolve_plugin_options
from frame.engine.client.base import EngineClient, EngineDeadError, EngineRefusedError, RankState
from frame.engine.client.ranks import RankSlot
from frame.engine.wire.client_core import Outputs, Rejected, ToEngine
from frame.engine.wire.requests import EngineRequest, EngineStats
from frame.interfaces.router import Router, RouteRequest, block_digests
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry

log = logging.getLogger("frame.engine.client.dp")

#: ``make_rank(config, previous)``: a fresh engine client for one rank; ``previous`` is the rank's last client
#: when it is being restarted (a Ray client reattaches to the actor Ray restarted), else None.
RankFactory = Callable[[EngineConfig, EngineClient | None], EngineClient]


def make_router(config: EngineConfig, registry: PluginRegistry | None = None) -> Router:
    """The ``config.router`` plugin for ``config.data_parallel_size`` ranks, its options checked."""
    hooks = PluginHooks(registry or PluginRegistry())
    options = resolve_plugin_options("router", config.router, config.router_options,
                                     hooks.options_model("router", config.router))
    return hooks.create_router(config.router, config.data_parallel_size, config.block_size, options)


class DataParallelClient(EngineClient):
    """``config.data_parallel_size`` engine cores as one client."""

    def __init__(self, config: EngineConfig, make_rank: RankFactory, router: Router | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        """``on_close`` runs once every rank is shut down (the Ray side gives its placement groups back)."""
        super().__init__()
        self._on_close = on_close
        self.config = config
        self.mode = config.distributed_backend
        self.router = router or make_router(config)
        self._make_rank = make_rank
        self.slots = [RankSlot(r, config.model_copy(update={"data_parallel_rank": r}))
                      for r in range(config.data_parallel_size)]
        self._where: dict[str, int] = {}  # sequence id -> rank
        self._closing = False

    # -- starting ranks ---------------------------------------------------------------------------------
    async def _launch(self) -> None:
        started = await asyncio.gather(*(self._start_rank(slot) for slot in self.slots), return_exceptions=True)
        failed = [(slot, err) for slot, err in zip(self.slots, started, strict=True) if isinstance(err, BaseException)]
        assert self._ready is not None
        if failed:
            slot, err = failed[0]
            usage = next((e for _, e in failed if isinstance(e, EngineRefusedError)), None)
            # Every rank refuses the same mistake: its one sentence, not a dead rank.
            self._ready.set_exception(usage or EngineDeadError(f"engine core rank {slot.rank} did not start: {err}"))
            return
        self._ready.set_result(self.slots[0].client.info)  # type: ignore[union-attr]

    async def _start_rank(self, slot: RankSlot, previous: EngineClient | None = None) -> None:
        slot.status, slot.reason = "starting", None
        client = self._make_rank(slot.config, previous)
        client.listener = lambda msg: self._on_rank_message(slot, client, msg)
        client.on_dead = lambda reason: self._on_rank_dead(slot, client, reason)
        slot.client = client
        try:
            await client.start()
        except BaseException as err:
            slot.status, slot.reason = "down", str(err)
            await client.shutdown()
            raise
        slot.load.reset()
        slot.died = asyncio.Event()
        slot.status = "ok"
        log.info("engine core rank %d ready (%s, pid %s)", slot.rank, client.mode, client.pid)

    async def restart_rank(self, rank: int) -> None:
        """Start rank ``rank`` again after its core died; raises EngineDeadError when the new one fails."""
        slot = self.slots[rank]
        previous = slot.client
        if previous is not None:
            await previous.shutdown()  # the dead one's sockets and folder (a Ray actor is left to Ray)
        self.router.rank_reset(rank)
        await self._start_rank(slot, previous)

    async def wait_rank_death(self, rank: int) -> None:
        """Return when rank ``rank``'s current core dies."""
        await self.slots[rank].died.wait()

    # -- a rank's messages and death ----------------------------------------------------------------------
    def _on_rank_message(self, slot: RankSlot, client: EngineClient, msg: Outputs | Rejected) -> None:
        if slot.client is not client:
            return  # a message from a core this rank has replaced
        if isinstance(msg, Rejected):
            self._forget(msg.request_id)
        else:
            if msg.load is not None:
                slot.load.reported(msg.load)
            for out in msg.outputs:
                if out.finished:
                    self._forget(out.request_id)
            if not msg.outputs:
                return
            msg = Outputs(msg.outputs)
        if self.listener is not None:
            self.listener(msg)

    def _forget(self, sequence_id: str) -> None:
        rank = self._where.pop(sequence_id, None)
        if rank is not None:
            self.slots[rank].open.pop(sequence_id, None)

    def _on_rank_dead(self, slot: RankSlot, client: EngineClient, reason: str) -> None:
        if slot.client is not client or self._closing:
            return
        slot.status, slot.reason = "down", reason
        lost = list(slot.open)
        slot.open.clear()
        for sequence_id in lost:
            self._where.pop(sequence_id, None)
        slot.load.reset()
        self.router.rank_reset(slot.rank)
        log.error("engine core rank %d died: %s; %d sequences lost; %d of %d ranks serve", slot.rank, reason,
                  len(lost), sum(s.serving for s in self.slots), len(self.slots))
        if lost and self.on_lost is not None:
            self.on_lost(lost, f"engine core rank {slot.rank} died ({reason})")
        slot.died.set()

    # -- requests ---------------------------------------------------------------------------------------
    def add(self, requests: list[EngineRequest]) -> None:
        """Route ``requests`` (the sequences of one prompt: they share it) to one live rank and send them there."""
        self._check_alive()
        live = [slot for slot in self.slots if slot.serving]
        if not live:
            raise EngineDeadError("no engine core is serving: " + "; ".join(s.describe() for s in self.slots))
        first = requests[0]
        prompt = first.prompt_token_ids
        max_new = first.params.max_tokens or max(1, (self.info.max_model_len if self.info else 0) - len(prompt))
        digests = (block_digests(prompt, self.config.block_size, first.cache_salt)
                   if self.router.uses_prefix_digests else ())
        rank = self.router.route(RouteRequest(first.request_id, len(prompt), max_new, digests),
                                 [slot.load.current() for slot in live])
        slot = next((s for s in live if s.rank == rank), None)
        if slot is None:
            raise RuntimeError(f"the router '{self.config.router}' chose rank {rank}, which is not among the live "
                               f"ranks {[s.rank for s in live]}")
        slot.client.add(requests)  # type: ignore[union-attr]
        slot.routed += 1
        for req in requests:
            slot.open[req.request_id] = None
            self._where[req.request_id] = rank
            slot.load.sent_sequence(len(prompt) + max_new)

    def abort(self, request_ids: list[str]) -> None:
        by_rank: dict[int, list[str]] = {}
        for rid in request_ids:
            if rid in self._where:
                by_rank.setdefault(self._where[rid], []).append(rid)
        for rank, ids in by_rank.items():
            slot = self.slots[rank]
            if slot.serving:
                slot.client.abort(ids)  # type: ignore[union-attr]

    def rank_of(self, sequence_id: str) -> int | None:
        """The rank serving an open sequence (None once it finished)."""
        return self._where.get(sequence_id)

    # -- state ------------------------------------------------------------------------------------------
    async def rank_stats(self) -> dict[int, EngineStats]:
        live = [slot for slot in self.slots if slot.serving]
        answers = await asyncio.gather(*(s.client.stats() for s in live), return_exceptions=True)  # type: ignore
        return {s.rank: a for s, a in zip(live, answers, strict=True) if isinstance(a, EngineStats)}

    async def stats(self, timeout_s: float = 5.0) -> EngineStats:
        """The serving cores' stats summed (gauges: KV usage over every pool together)."""
        self._check_alive()
        return sum_stats(list((await self.rank_stats()).values()))

    def rank_states(self) -> list[RankState]:
        return [slot.state() for slot in self.slots]

    @property
    def healthy(self) -> bool:
        return self.dead_reason is None and any(slot.serving for slot in self.slots)

    @property
    def pid(self) -> int | None:
        client = self.slots[0].client
        return client.pid if client is not None else None

    def _send(self, msg: ToEngine) -> None:
        """Broadcast ``msg`` to every serving core."""
        for slot in self.slots:
            if slot.serving:
                slot.client._send(msg)  # type: ignore[union-attr]

    async def shutdown(self) -> None:
        self._closing = True
        await asyncio.gather(*(s.client.shutdown() for s in self.slots if s.client is not None),
                             return_exceptions=True)
        for slot in self.slots:
            slot.status = "down"
        if self._on_close is not None:
            self._on_close()
            self._on_close = None
        if self.dead_reason is None:
            self.dead_reason = "the engine was shut down"


def sum_stats(parts: list[EngineStats]) -> EngineStats:
    """Several cores' stats as one: counters and block counts add up, KV usage is over the pools together."""
    total = EngineStats()
    for part in parts:
        for name in EngineStats.__struct_fields__:
            mine, theirs = getattr(total, name), getattr(part, name)
            if name == "kv_groups":
                total.kv_groups = theirs or mine  # every core serves the same model
            elif isinstance(theirs, list):  # per KV group
                setattr(total, name, [a + b for a, b in zip(mine or [0] * len(theirs), theirs, strict=True)])
            elif name != "kv_usage":
                setattr(total, name, mine + theirs)
    total.kv_usage = total.blocks_in_use / total.num_blocks if total.num_blocks else 0.0
    return total
