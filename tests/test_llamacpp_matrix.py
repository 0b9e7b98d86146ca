"""frame against llama.cpp on GGUF files made by llama.cpp's own quantizer, one per preset (issue 30's matrix).

llama.cpp is the independent check: it writes each file (``llama_model_quantize`` on the bundled SmolLM2-135M
GGUF, requantizing its Q4_1 blocks into the preset's mix) and reads it back. frame then loads the same file with
``--quantization gguf`` (each tensor packed in its own type) and, given the same ids, must pick llama.cpp's greedy
next token at >= 90% of teacher-forced positions (fed llama.cpp's own greedy continuation, so one near-tie cannot
cascade) and score the shipped text within 1% of llama.cpp's perplexity.

llama-cpp-python is never frame's dependency: it lives in a virtual environment of its own, named by
``FRAME_LLAMACPP_PYTHON`` (its interpreter, e.g. ``/work/llama-venv/bin/python``); without it these tests skip.
Each preset takes one to two minutes on two shared cores.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from frame import default_model_path
from frame.bench.perplexity import Prefiller, bos_of, chunks, score, token_ids
from frame.config import EngineConfig

PEER = os.environ.get("FRAME_LLAMACPP_PYTHON", "")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not PEER or not Path(PEER).exists(),
                                 reason="FRAME_LLAMACPP_PYTHON names no interpreter with llama-cpp-python")]
PRESETS = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "Q5_0", "Q5_1", "Q4_0"]
N_CTX, PROMPT, N_GEN = 512, 32, 96  # perplexity: every chunk of 512 of the text (1,275 scored ids)


@pytest.fixture(scope="module")
def ids() -> dict[str, list]:
    """The shipped text's ids by frame's tokenizer (the bundled file's): a prompt and perplexity chunks."""
    from frame.model_source import ModelSource

    tokenizer = ModelSource.open(str(default_model_path()), None, False).tokenizer
    text = token_ids(tokenizer)
    bos = bos_of(tokenizer)
    prompt = ([bos] if bos is not None else []) + text[:PROMPT]
    return {"prompt": prompt, "chunks": chunks(text, N_CTX, bos)}


def llama_cpp(tmp_path: Path, preset: str, ids: dict[str, list]) -> dict:
    spec = {"source": str(default_model_path()), "out": str(tmp_path / f"smollm2-{preset}.gguf"), "preset": preset,
            "threads": 2, "prompt": ids["prompt"], "n_gen": N_GEN, "chunks": ids["chunks"]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([PEER, str(Path(__file__).parent / "llamacpp_peer.py"), str(tmp_path / "spec.json")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "file": spec["out"]}


@pytest.mark.parametrize("preset", PRESETS)
def test_frame_agrees_with_llama_cpp_on_its_own_file(preset: str, ids: dict[str, list], tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    peer = llama_cpp(tmp_path, preset, ids)
    with caplog.at_level(logging.WARNING, logger="frame_quantization_gguf"):
        model = Prefiller(EngineConfig(model=peer["file"], quantization="gguf", dtype="float32", platform="cpu"),
                          N_CTX)
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # every matrix stayed packed
    forced = ids["prompt"] + peer["continuation"]
    logits = model.logits(forced)
    picks = logits[len(ids["prompt"]) - 1 : -1].argmax(-1).tolist()
    agree = sum(a == b for a, b in zip(picks, peer["continuation"], strict=True)) / N_GEN
    scores = [score(model.logits(chunk), chunk) for chunk in ids["chunks"]]
    nll, count = sum(s[0] for s in scores), sum(s[1] for s in scores)
    ours, theirs = math.exp(nll / count), math.exp(peer["nll"] / peer["tokens"])
    print(f"{preset}: greedy agreement {agree:.3f}, perplexity frame {ours:.4f} llama.cpp {theirs:.4f} "
          f"({(ours / theirs - 1) * 100:+.2f}%), llama-cpp-python {peer['version']}", file=sys.stderr)
    assert agree >= 0.9
    assert abs(ours / theirs - 1) <= 0.01
