"""CompileQueue: constrained requests wait here while their grammar compiles in a thread, off the engine loop.

A grammar the cache lacks can take seconds to compile (the API server bounds it with ``--grammar-compile-timeout``
before the request is sent, and the engine compiles its own copy). Compiled in the loop, those seconds would stop
every running request; here the loop hands the constraint to one compile thread (xgrammar releases the GIL while it
compiles), goes on stepping, and adds the request once its grammar is ready. Requests with the same constraint
share one compilation. A request aborted while it waits is dropped; its grammar is still cached when it arrives.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from frame.engine.core.grammar_cache import digest

if TYPE_CHECKING:
    from frame.engine.core.structured import StructuredOutputManager
    from frame.engine.wire.requests import EngineRequest


def _yield_to_steps() -> None:
    """Run the compile thread at nice 10 (Linux schedules threads one by one): a compile at the engine's priority
    takes a core from its compute threads, which wait for each other at every step, and stalls every request."""
    with contextlib.suppress(AttributeError, OSError):  # no per-thread priority here: the compile runs as it is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def _finished(value: tuple[Any, int, float]) -> Future[tuple[Any, int, float]]:
    future: Future[tuple[Any, int, float]] = Future()
    future.set_result(value)
    return future


class CompileQueue:
    """Requests waiting for their grammar, by id; :meth:`ready` hands back those whose compile has ended."""

    def __init__(self, structured: StructuredOutputManager | None) -> None:
        self.structured = structured
        self._threads = ThreadPoolExecutor(1, thread_name_prefix="frame-engine-grammar", initializer=_yield_to_steps)
        self._jobs: dict[bytes, Future[tuple[Any, int, float]]] = {}
        self._waiting: dict[str, tuple[EngineRequest, bytes]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def needs(self, req: EngineRequest) -> bool:
        """True when ``req`` carries a constraint whose grammar is not ready yet."""
        spec = req.params.structured_outputs
        return spec is not None and self.structured is not None and not self.structured.is_ready(spec)

    def submit(self, req: EngineRequest) -> None:
        """Start (or join) the compilation of ``req``'s constraint; ``req`` waits here until :meth:`ready`."""
        spec = req.params.structured_outputs
        assert spec is not None
        key = digest(spec)
        if key not in self._jobs:
            self.structured.prepare()
            self._jobs[key] = self._threads.submit(self.structured.build, spec)
        self._waiting[req.request_id] = (req, key)

    def cancel(self, request_ids: list[str]) -> list[str]:
        """Forget waiting requests (aborted) and return the ids this queue held; others are ignored."""
        return [req_id for req_id in request_ids if self._waiting.pop(req_id, None) is not None]

    def ready(self) -> list[tuple[EngineRequest, BaseException | None]]:
        """The waiting requests whose compile ended, each with the error it raised (None: the grammar is ready to
        be added). Finished grammars are stored in the manager here, in the loop thread."""
        done = {key: job for key, job in self._jobs.items() if job.done()}
        if not done:
            return []
        errors: dict[bytes, BaseException | None] = {}
        for key, job in done.items():
            del self._jobs[key]
            errors[key] = job.exception()
        out = []
        for req_id, (req, key) in list(self._waiting.items()):
            if key in done:
                del self._waiting[req_id]
                error = errors[key]
                if error is None:  # each request takes its own hand-off; the seconds count once
                    compiled, size, seconds = done[key].result()
                    self.structured.store(req.params.structured_outputs, (compiled, size, seconds))  # type: ignore[arg-type]
                    done[key] = _finished((compiled, size, 0.0))
                out.append((req, error))
        return out

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
