"""The messages between an engine client and an engine core loop: one tagged msgspec union each way.

They cross the process boundary as msgpack over ZeroMQ (never pickle); in the in-process mode the same objects
pass through thread-safe queues, so both modes run the same loop code.
"""

from __future__ import annotations

from typing import Union

import msgspec

from frame.engine.wire.requests import EngineOutput, EngineRequest, EngineStats


# -- client -> engine ---------------------------------------------------------------------------------------
class AddRequests(msgspec.Struct, tag="add"):
    """Sequences to schedule (already checked by the client)."""

    requests: list[EngineRequest]


class AbortRequests(msgspec.Struct, tag="abort"):
    """Sequence ids to abort; their KV blocks return to the pool. Unknown ids are ignored."""

    request_ids: list[str]


class GetStats(msgspec.Struct, tag="stats"):
    """Ask for an :class:`EngineStats` snapshot; answered with a :class:`StatsReply` carrying ``call_id``."""

    call_id: int


class ResetPrefixCache(msgspec.Struct, tag="reset_cache"):
    """Drop every cached prefix (benchmarks start each run cold); ignored while requests are in flight."""


class Shutdown(msgspec.Struct, tag="shutdown"):
    """Stop the loop and exit."""


# -- engine -> client ---------------------------------------------------------------------------------------
class Ready(msgspec.Struct, tag="ready"):
    """The engine core is built: what the client needs to validate requests before sending them, and what it runs
    with, for the start-up summary (:mod:`frame.summary`)."""

    pid: int
    max_model_len: int
    vocab_size: int
    num_blocks: int
    model_name: str
    max_speculative_tokens: int = 0
    family: str = ""
    dtype: str = ""
    #: The quantization plugin that keeps the weights packed; None: dense weights.
    quantization: str | None = None
    platform: str = ""
    #: The platform's kernel path for this dtype's (or quantization's) linears; "" where it names none.
    isa_path: str = ""
    attn: str = ""
    cache: str = ""
    sched: str = ""
    block_size: int = 0
    #: Bytes of one rank's KV pool.
    kv_bytes: int = 0
    #: The pool's dtype as ``--kv-cache-dtype`` spells it (``bfloat16``, ``int8``).
    kv_dtype: str = ""
    #: The batch-size buckets the driver rank records decode steps for (empty: every step runs eagerly).
    decode_graphs: list[int] = []


class CoreLoad(msgspec.Struct, array_like=True):
    """What the core holds, for a data-parallel router: ``received`` requests so far (every AddRequests entry,
    refused ones too, so a client can tell which of its sends a report covers), the requests it holds (running
    or waiting) and the tokens still to compute for them (see :meth:`EngineCore.outstanding_tokens`)."""

    received: int
    num_requests: int
    num_tokens: int


class Outputs(msgspec.Struct, tag="outputs"):
    """The outputs of one step (or of an abort); ``load`` is the core's load after it (an update with no
    outputs follows every batch of added requests)."""

    outputs: list[EngineOutput]
    load: CoreLoad | None = None


class StatsReply(msgspec.Struct, tag="stats_reply"):
    """The answer to :class:`GetStats`."""

    call_id: int
    stats: EngineStats


class Rejected(msgspec.Struct, tag="rejected"):
    """The engine core refused a request (the client's checks should make this rare)."""

    request_id: str
    message: str
    status: int = 400
    code: str = "invalid_request"
    param: str | None = None


class Failed(msgspec.Struct, tag="failed"):
    """The engine could not start, or its loop crashed; the process exits after sending this. ``usage``: the
    start failed on a mistake the user can fix (a :class:`~frame.errors.FrameUsageError`: an unknown plugin, a
    missing model), and ``message`` is that one sentence."""

    message: str
    usage: bool = False


# msgspec needs typing Unions here.
ToEngine = Union[AddRequests, AbortRequests, GetStats, ResetPrefixCache, Shutdown]  # noqa: UP007
FromEngine = Union[Ready, Outputs, StatsReply, Rejected, Failed]  # noqa: UP007
