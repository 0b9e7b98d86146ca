"""The experiment runner end to end on a tiny config, through the real CLI; and model sharing between cells."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from frame.bench.driver import drive
from frame.bench.shared_model import LoadedModels, SharedModelEngine
from frame.config import build_config
from frame.engine.core.engine_core import EngineCore
from frame.workloads import load_workloads

TINY = Path(__file__).with_name("tiny_experiment.yaml")


def test_tiny_experiment_writes_every_output_and_reports_the_failing_cell(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "frame.cli.main", "bench", "--config", str(TINY), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "4 of 6 cells ran" in proc.stdout
    assert "No cache plugin named 'no_such_cache' is installed" in proc.stdout
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["workload"], r["opt_cache"]) for r in rows] == [
        (w, c) for c in ("hashchain", "radix", "no_such_cache") for w in ("multi_turn", "shared_prefix")]
    ok = [r for r in rows if r["error"] is None]
    failed = [r for r in rows if r["error"] is not None]
    assert len(ok) == 4 and all(r["opt_cache"] == "no_such_cache" for r in failed)
    for r in ok:
        assert r["output_tokens"] == 3 * r["requests"]
        assert r["prompt_tokens_computed"] + r["prompt_tokens_cached"] == r["prompt_tokens"]  # no preemptions here
        assert 0 < r["peak_blocks_in_use"] <= 24 and r["ttft_p50_ms"] > 0
    by = {(r["workload"], r["opt_cache"]): r for r in ok}
    # turn 2 of each chat reuses turn 1's prompt: whole blocks under hashchain, every token under radix
    assert 0 < by[("multi_turn", "hashchain")]["prefix_hit_rate"] < by[("multi_turn", "radix")]["prefix_hit_rate"]
    markdown = (out / "results.md").read_text()
    assert "| multi_turn | cache=radix |" in markdown and "UnknownPluginError" in markdown
    for name in ("output_tok_s", "ttft_p50_ms", "prefix_hit_rate", "prompt_tokens_computed"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_shared_model_generates_what_a_freshly_loaded_one_does(smol_source) -> None:
    requests = load_workloads().get("multi_turn").generate(smol_source.tokenizer, 2, num_conversations=2,
                                                           num_turns=2, system_len=8, user_len=[4, 8],
                                                           reply_len=[4, 8], max_tokens=4)
    base = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 24}
    models = LoadedModels()
    SharedModelEngine(build_config(base), smol_source, models)
    shared = SharedModelEngine(build_config(base, cache="radix", block_size=8), smol_source, models)
    assert models.loads == 1
    fresh = EngineCore(build_config(base, cache="radix", block_size=8), source=smol_source)
    assert fresh.executor.worker.runner.model is not shared.executor.worker.runner.model
    tokens = [[t.output_token_ids for t in drive(e, requests).timings] for e in (shared, fresh)]
    assert tokens[0] == tokens[1] and all(len(t) == 4 for t in tokens[0])
