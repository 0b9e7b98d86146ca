"""The constraint compile limit counts the worker's CPU time (issue 36): the worker runs at nice 10, so on a busy
server its compiles are slower by the clock, and a compile is refused for what it costs, not for the engine's load.

Real child processes stand in for the constraint worker (they read the check and never answer): one spins (uses
its CPU time), one sleeps (what a starved worker looks like from outside: the clock runs, its CPU time does not).
"""

from __future__ import annotations

import asyncio
import sys
import time

from frame.config import EngineConfig
from frame.engine.wire.constraint import Check, FromConstraintWorker
from frame.sampling_params import StructuredOutputs
from frame.server.constraints import CLOCK_FACTOR, ConstraintChecker
from frame.server.piped import PipedWorker

LIMIT_S = 0.6


async def _timed_out_after(child_code: str, clock_limit_s: float | None = None) -> tuple[float, float]:
    """Seconds by the clock until the check of a never-answering child times out, and the child's CPU seconds."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", child_code, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE)
    worker = PipedWorker(proc, FromConstraintWorker)
    checker = ConstraintChecker(EngineConfig(model="unused"), vocab_size=8, stop_token_ids=[], timeout_s=LIMIT_S)
    if clock_limit_s is not None:
        checker.clock_limit_s = clock_limit_s
    await asyncio.sleep(0.3)  # the interpreter's start-up is not the compile's cost
    before = worker.cpu_seconds()
    started = time.monotonic()
    try:
        await checker._answer_within_limit(worker, Check(StructuredOutputs(choice=["a", "b"])))
    except asyncio.TimeoutError:
        clock, cpu = time.monotonic() - started, worker.cpu_seconds()
    else:
        raise AssertionError("a worker that never answers was answered")
    finally:
        await worker.kill()
    assert before is not None and cpu is not None
    return clock, cpu - before


def test_a_spinning_compile_is_stopped_by_its_cpu_time():
    # The clock limit is set far out, so only the CPU limit can stop it, however loaded the host is.
    clock, cpu = asyncio.run(_timed_out_after("while True: pass", clock_limit_s=60.0))
    assert LIMIT_S <= cpu < LIMIT_S + 0.5 and clock < 30.0, (clock, cpu)


def test_a_starved_compile_gets_the_clock_limit_not_the_cpu_limit():
    clock, cpu = asyncio.run(_timed_out_after("import time; time.sleep(600)"))
    assert cpu < 0.1, cpu
    assert CLOCK_FACTOR * LIMIT_S <= clock < CLOCK_FACTOR * LIMIT_S + 2.0, clock
