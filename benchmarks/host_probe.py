"""What the host gives this machine right now: the read floor of two threads and where its two CPUs sit.

    .venv/bin/python benchmarks/host_probe.py [--every 2] [--count 30]

On a virtual machine the host may move the virtual CPUs between its cores while a benchmark runs. On an AMD EPYC
(a Zen 4 with two virtual CPUs, 2026-12-06) that mattered more than anything frame did: with both CPUs on one CCD
(one L3, one link to memory; a cache line's round trip between them about 80 ns) two threads read memory at
31-37 GB/s, and with them on two CCDs (about 350 ns) at 55-66 GB/s. A bandwidth-bound single stream follows the
floor; vLLM, bound by its per-step overhead, hardly moves. So a same-run ratio means little without the state each
round ran in, and ``compare_vllm.py --probe-host`` prints it beside every round. Run alone, this prints one line
every ``--every`` seconds: the floor and the round trip.
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from frame import native

_SOURCE = Path(__file__).with_name("read_floor.cpp")


@dataclass(frozen=True)
class HostState:
    read_gbs: float  # best of a few passes of torch's intra-op threads over a buffer on huge pages
    round_trip_ns: float | None  # a cache line between the first two CPUs and back (None: one CPU)

    def __str__(self) -> str:
        trip = "-" if self.round_trip_ns is None else f"{self.round_trip_ns:.0f} ns"
        return f"floor {self.read_gbs:.1f} GB/s, CPU round trip {trip}"

    def same_placement(self, other: HostState) -> bool:
        """Were the CPUs placed alike in both states? A round trip more than twice the other's means the host
        moved them (a Zen VM between one CCD, 70-140 ns, and two, 350-450 ns)."""
        if self.round_trip_ns is None or other.round_trip_ns is None:
            return self.round_trip_ns is None and other.round_trip_ns is None
        low, high = sorted((self.round_trip_ns, other.round_trip_ns))
        return high <= 2 * low


class HostProbe:
    """A read buffer on transparent huge pages (as the platform keeps a model's weights) and the two probes."""

    def __init__(self, buffer_mib: int = 256) -> None:
        native.load_library("frame_bench_floor", [_SOURCE], ("-O3", "-march=native"))
        self._map = mmap.mmap(-1, buffer_mib << 20)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE)
        self.buffer = torch.frombuffer(self._map, dtype=torch.float32)
        self.buffer.fill_(1.0)
        cpus = sorted(os.sched_getaffinity(0))
        self.cpus = cpus[:2] if len(cpus) > 1 else None

    def measure(self, passes: int = 3, trips: int = 20000) -> HostState:
        # The round trip first, after a pause: torch's OpenMP workers spin for a while after a parallel region,
        # and one spinning on either CPU would be timed as part of the trip.
        time.sleep(0.05)
        trip = (torch.ops.frame_bench.core_round_trip(self.cpus[0], self.cpus[1], trips)
                if self.cpus is not None else None)
        read = torch.ops.frame_bench.read_floor.default
        best = float("inf")
        for _ in range(passes):
            t = time.perf_counter()
            read(self.buffer)
            best = min(best, time.perf_counter() - t)
        return HostState(self.buffer.numel() * 4 / best / 1e9, trip)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=2.0, help="seconds between lines")
    parser.add_argument("--count", type=int, default=30)
    args = parser.parse_args()
    probe = HostProbe()
    for _ in range(args.count):
        print(f"{time.strftime('%H:%M:%S')} {probe.measure()}", flush=True)
        time.sleep(args.every)


if __name__ == "__main__":
    main()
