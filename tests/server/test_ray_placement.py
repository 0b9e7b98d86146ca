"""A Ray placement that cannot be met is one sentence, within seconds, not a silent wait: `frame serve
--data-parallel-size 4 --distributed-backend ray` on a Ray cluster of two CPUs names the CPUs asked for and those
the cluster has, and exits with status 1."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="ray is the optional extra frame-engine[ray]")


def test_data_parallel_beyond_the_clusters_cpus_fails_naming_the_resources() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--port", "0", "--data-parallel-size",
                              "4", "--distributed-backend", "ray", "--ray-address", address],
                             capture_output=True, text=True, timeout=300, env=os.environ)
        took = time.monotonic() - started
    finally:
        ray.shutdown()
    assert out.returncode == 1, out.stderr[-3000:]
    assert ("ERROR frame.server: the engine did not start: engine core rank 0 did not start: Ray cannot place 4 "
            "placement group(s) of [{'CPU': 1.0}]: they ask for 4 CPU in all, and the Ray cluster has 2 CPU (2 CPU "
            "free); lower --data-parallel-size or --tensor-parallel-size, or add nodes to the cluster.") in out.stderr
    assert "Traceback" not in out.stderr
    assert took < 60
