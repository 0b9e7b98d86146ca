"""``frame bench throughput`` through the real CLI: both systems run on the same prompts and are printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FRAME = [sys.executable, "-m", "frame.cli.main"]


def test_throughput_runs_frame_and_transformers_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    proc = subprocess.run(
        [*FRAME, "bench", "throughput", "--workload", "mixed_batch", "--workload-opt", "num_requests=3",
         "--workload-opt", "prompt_len=[40,60]", "--workload-opt", "max_tokens=4", "--dtype", "float32",
         "--quantization", "none", "--max-model-len", "128", "--num-kv-blocks", "32", "--json", str(out)],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr
    assert "mixed_batch: 3 requests, dtype float32" in proc.stdout
    for row in ("frame ", "transformers ", "ratio frame/hf "):
        assert row in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    for system in ("frame", "transformers"):
        summary = result["systems"][system]["summary"]
        assert summary["requests"] == 3 and summary["output_tokens"] == 12
        assert summary["output_tok_s"] > 0 and summary["peak_rss_mib"] > 0
    ratio = result["ratio_frame_over_transformers"]["output_tok_s"]
    frame, hf = (result["systems"][s]["summary"]["output_tok_s"] for s in ("frame", "transformers"))
    assert abs(ratio - frame / hf) < 1e-9
    assert result["greedy_match"] == 1.0  # float32 dense greedy: the same tokens as the reference
    assert result["systems"]["frame"]["weights"] == "dense"


def test_latency_names_frames_packed_weights_beside_transformers_dense_ones() -> None:
    """The bundled .gguf runs packed by default; the report says so, since transformers runs the dense weights."""
    proc = subprocess.run(
        [*FRAME, "bench", "latency", "--workload-opt", "prompt_len=[20,30]", "--workload-opt", "max_tokens=3",
         "--dtype", "float32", "--max-model-len", "128", "--num-kv-blocks", "32"],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr
    assert "frame's weights gguf (transformers' dense)" in " ".join(proc.stdout.split()), proc.stdout


def test_throughput_on_two_tensor_parallel_ranks_reports_communication_per_step(tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    proc = subprocess.run(
        [*FRAME, "bench", "throughput", "--tensor-parallel-size", "2", "--workload-opt", "num_requests=2",
         "--workload-opt", "prompt_len=[20,30]", "--workload-opt", "max_tokens=3", "--dtype", "float32",
         "--max-model-len", "128", "--num-kv-blocks", "32", "--no-baseline", "--json", str(out)],
        capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr
    assert "frame on 2 tensor-parallel ranks" in proc.stdout
    assert "tensor parallelism: 2 ranks; communication " in proc.stdout and " ms per step (" in proc.stdout
    summary = json.loads(out.read_text())["systems"]["frame"]["summary"]
    assert summary["output_tokens"] == 6 and summary["comm_ms_per_step"] > 0


def test_a_bad_workload_option_is_one_line_without_a_traceback() -> None:
    proc = subprocess.run([*FRAME, "bench", "latency", "--workload-opt", "prompt_length=3", "--no-baseline"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: Workload 'single_stream' has no parameter 'prompt_length'; "
                                   "its parameters are: prompt_len, max_tokens.")


def test_bench_without_a_command_says_what_to_run() -> None:
    proc = subprocess.run([*FRAME, "bench"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "frame bench --config experiments/NAME.yaml" in proc.stderr


def test_bench_serve_reports_clearly_when_its_module_is_missing(monkeypatch) -> None:
    import argparse

    import pytest
    from frame.cli import bench
    from frame.errors import FrameUsageError

    monkeypatch.setattr(bench, "_SERVE_MODULE", "frame.bench.no_such_serve_module")
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["serve", "--url", "http://x"])
    with pytest.raises(FrameUsageError, match=r"`frame bench serve` is not available in this installation "
                                              r"\(frame.bench.no_such_serve_module is missing\)"):
        bench.run(args)
