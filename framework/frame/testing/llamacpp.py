"""llama.cpp as the independent check of frame's GGUF reading (issue 30's matrix), for the families' suites and the
bundled model's matrix alike.

llama.cpp writes each preset's file (``llama_model_quantize``, requantizing allowed) and reads it back, through
:mod:`frame.testing.llamacpp_peer` run by the interpreter of a virtual environment holding llama-cpp-python
(``FRAME_LLAMACPP_PYTHON``); llama-cpp-python is never frame's dependency, and without it these checks skip. frame
then loads the same file packed (``--quantization gguf``, each tensor in its own type) and, given the same ids, must
pick llama.cpp's greedy next token at most teacher-forced positions (fed llama.cpp's own greedy continuation, so one
near-tie cannot cascade) and score the same chunks within 1% of llama.cpp's perplexity.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from frame.config import EngineConfig

#: llama.cpp's quantization presets of the matrix (``LLAMA_FTYPE_MOSTLY_<preset>``): its common mixes.
PRESETS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "Q5_0", "Q5_1", "Q4_0")
#: The interpreter of the virtual environment holding llama-cpp-python, or "" where there is none.
PEER = os.environ.get("FRAME_LLAMACPP_PYTHON", "")
PEER_SCRIPT = Path(__file__).with_name("llamacpp_peer.py")


def skip_without_peer() -> None:
    """Skip the calling test where no llama-cpp-python interpreter is named."""
    if not PEER or not Path(PEER).exists():
        pytest.skip("FRAME_LLAMACPP_PYTHON names no interpreter with llama-cpp-python")


@dataclass
class PeerRun:
    """What llama.cpp made and said: the preset's file, its greedy continuation and its chunks' summed NLL."""

    file: Path
    continuation: list[int]
    nll: float
    tokens: int
    version: str


def run_peer(source: Path, out: Path, preset: str, prompt: Sequence[int], n_gen: int,
             chunks: Sequence[Sequence[int]], threads: int = 2) -> PeerRun:
    """Quantize ``source`` into ``preset`` at ``out`` with llama.cpp, continue ``prompt`` greedily for ``n_gen``
    tokens and score ``chunks`` (their second halves, each from an empty cache, as llama.cpp's perplexity tool)."""
    spec = out.with_suffix(".spec.json")
    spec.write_text(json.dumps({"source": str(source), "out": str(out), "preset": preset, "threads": threads,
                                "prompt": list(prompt), "n_gen": n_gen, "chunks": [list(c) for c in chunks]}))
    # -I: the script's folder (this package, whose platform.py would shadow the standard library's) stays off sys.path
    done = subprocess.run([PEER, "-I", str(PEER_SCRIPT), str(spec)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    return PeerRun(out, said["continuation"], said["nll"], said["tokens"], said["version"])


@dataclass
class Agreement:
    """frame against llama.cpp on one file: greedy agreement and the two perplexities."""

    greedy: float
    frame_perplexity: float
    llama_cpp_perplexity: float

    @property
    def perplexity_ratio(self) -> float:
        return self.frame_perplexity / self.llama_cpp_perplexity

    def describe(self, label: str, version: str) -> str:
        return (f"{label}: greedy agreement {self.greedy:.3f}, perplexity frame {self.frame_perplexity:.4f} "
                f"llama.cpp {self.llama_cpp_perplexity:.4f} ({(self.perplexity_ratio - 1) * 100:+.2f}%), "
                f"llama-cpp-python {version}")


def agreement(peer: PeerRun, prompt: Sequence[int], chunks: Sequence[Sequence[int]], platform: str = "cpu",
              caplog: pytest.LogCaptureFixture | None = None) -> Agreement:
    """Load ``peer.file`` packed in frame (float32, its KV cache float32 as the peer's) and compare it with what
    llama.cpp said. With ``caplog``, the load must log no warning from the gguf plugin (every matrix stayed packed,
    none dequantized)."""
    from frame.bench.perplexity import Prefiller, score

    n_ctx = max(len(prompt) + len(peer.continuation), *(len(c) for c in chunks))
    config = EngineConfig(model=str(peer.file), quantization="gguf", dtype="float32", kv_cache_dtype="float32",
                          platform=platform)
    if caplog is not None:
        with caplog.at_level(logging.WARNING, logger="frame_quantization_gguf"):
            model = Prefiller(config, n_ctx)
        assert not caplog.records, [r.getMessage() for r in caplog.records]
    else:
        model = Prefiller(config, n_ctx)
    forced = [*prompt, *peer.continuation]
    picks = model.logits(forced)[len(prompt) - 1 : -1].argmax(-1).tolist()
    greedy = sum(a == b for a, b in zip(picks, peer.continuation, strict=True)) / len(peer.continuation)
    scores = [score(model.logits(chunk), chunk) for chunk in chunks]
    nll, count = sum(s[0] for s in scores), sum(s[1] for s in scores)
    return Agreement(greedy, math.exp(nll / count), math.exp(peer.nll / peer.tokens))
