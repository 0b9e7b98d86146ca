"""A Ray placement that cannot be met is one sentence, not a silent wait: `frame serve --data-parallel-size N
--distributed-backend ray` on a Ray cluster of two CPUs names the CPUs asked for and those the cluster has, and
exits with status 1: at once when the cluster is too small, after frame's placement timeout (60 s) when its CPUs
are taken by someone else."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="ray is the optional extra frame-engine[ray]")


@pytest.fixture(scope="module")
def two_cpus() -> str:
    """A local Ray cluster of two CPUs; its address."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _serve(address: str, ranks: int) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--port", "0", "--data-parallel-size",
                          str(ranks), "--distributed-backend", "ray", "--ray-address", address],
                         capture_output=True, text=True, timeout=300, env=os.environ)
    return out, time.monotonic() - started


def test_data_parallel_beyond_the_clusters_cpus_fails_at_once_naming_the_resources(two_cpus: str) -> None:
    out, took = _serve(two_cpus, 4)
    assert out.returncode == 1, out.stderr[-3000:]
    assert ("ERROR frame.server: the engine did not start: engine core rank 0 did not start: Ray cannot place 4 "
            "placement group(s) of [{'CPU': 1.0}]: they ask for 4 CPU in all, and the Ray cluster has 2 CPU (2 CPU "
            "free); lower --data-parallel-size or --tensor-parallel-size, or add nodes to the cluster.") in out.stderr
    assert "Traceback" not in out.stderr
    assert took < 60


def test_cpus_that_stay_taken_fail_after_the_placement_timeout(two_cpus: str) -> None:
    from frame.engine.process import PLACEMENT_TIMEOUT_S
    from ray.util.placement_group import placement_group, remove_placement_group

    holder = placement_group([{"CPU": 2.0}])  # another job holding both CPUs
    ray.get(holder.ready(), timeout=60)
    try:
        out, took = _serve(two_cpus, 2)
    finally:
        remove_placement_group(holder)
    assert out.returncode == 1, out.stderr[-3000:]
    assert (f"Ray cannot place 2 placement group(s) of [{{'CPU': 1.0}}] in {PLACEMENT_TIMEOUT_S:.0f} s: they ask "
            "for 2 CPU in all, and the Ray cluster has 2 CPU (0 CPU free)") in out.stderr
    assert PLACEMENT_TIMEOUT_S <= took < PLACEMENT_TIMEOUT_S + 60
