"""The cpu platform's decode graphs: a step recorded once per batch-size bucket, then replayed as a native program.

:meth:`CpuPlatform.capture_graph <frame_platform_cpu.platform.CpuPlatform.capture_graph>` answers the runner's
graph seam (:mod:`frame.engine.worker.graphs`) with :class:`RecordedStep`. The runner asks for every bucket up to
``max_num_seqs`` at start; recording one costs a real step of that size, so each bucket records on its first use
instead (the recording run is that step, with its real inputs, replayed once more to check the replay gives the
same numbers), and buckets a server never sees cost nothing. ``frame serve`` records them all while it starts
(``record_graphs_at_start``: the runner replays each bucket once over its padding rows), as vLLM captures its CUDA
graphs, so its first clients do not pay 35-100 ms a bucket. A step that cannot be recorded, or whose replay fails
or differs (:class:`~frame_platform_cpu.record.NotRecordable`), keeps running eagerly, logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from frame_platform_cpu.record import NotRecordable, record
from frame_platform_cpu.replay import compile_replay

log = logging.getLogger("frame.platform.cpu")


class RecordedStep:
    """A replay of the step ``fn`` that records it on its first call (returning that run's output) and from then
    on runs the recording; ``fn`` itself wherever the recording fails.

    ``calls`` is the number of op calls recorded (None before the first call, 0 when the step runs eagerly).
    ``teams``: whether the native program runs stretches of the platform's calls as teams (``program.py``)."""

    def __init__(self, fn: Callable[[], torch.Tensor], teams: bool = True) -> None:
        self.fn = fn
        self.teams = teams
        self.calls: int | None = None
        self._run: Callable[[], torch.Tensor] | None = None

    def __call__(self) -> torch.Tensor:
        if self._run is not None:
            return self._run()
        try:
            recording, out = record(self.fn)
            expected = out.clone()  # a planned replay writes its output where the recorded run left it
            run = compile_replay(recording, teams=self.teams)
            # The same step once more, replayed (it rewrites the step's KV rows with the same values): a replay
            # that fails or differs from the run it repeats would be wrong on every later step, so it is not kept.
            try:
                replayed = run()
            except RuntimeError as e:
                raise NotRecordable(f"its replay failed: {str(e).splitlines()[0]}") from e
            if not torch.equal(replayed, expected):
                raise NotRecordable("its replay gave other numbers than the step it recorded")
            self._run, self.calls = run, len(recording.calls)
            log.debug("recorded a decode step: %d op calls over %d tensors", self.calls, len(recording.externals))
            return replayed
        except NotRecordable as e:
            # A partial run only rewrote KV rows that the eager rerun writes again with the same values.
            log.info("a decode step runs eagerly: the cpu platform cannot record it (%s)", e)
            self._run, self.calls = self.fn, 0
            return self.fn()
