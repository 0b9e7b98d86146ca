"""frame against llama.cpp on GGUF files made by llama.cpp's own quantizer, one per preset (issue 30's matrix).

llama.cpp is the independent check: it writes each file (``llama_model_quantize`` on the bundled SmolLM2-135M
GGUF, requantizing its Q4_1 blocks into the preset's mix) and reads it back. frame then loads the same file with
``--quantization gguf`` (each tensor packed in its own type) and, given the same ids, must pick llama.cpp's greedy
next token at >= 90% of teacher-forced positions (fed llama.cpp's own greedy continuation, so one near-tie cannot
cascade) and score the shipped text within 1% of llama.cpp's perplexity.

llama-cpp-python is never frame's dependency: it lives in a virtual environment of its own, named by
``FRAME_LLAMACPP_PYTHON`` (its interpreter, e.g. ``/work/llama-venv/bin/python``); without it these tests skip
(:mod:`frame.testing.llamacpp`). Every model family's suite runs the same presets on a tiny random checkpoint.
Each preset takes one to two minutes on two shared cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from frame import default_model_path
from frame.bench.perplexity import bos_of, chunks, token_ids
from frame.testing.llamacpp import PRESETS, agreement, run_peer, skip_without_peer

pytestmark = pytest.mark.slow
N_CTX, PROMPT, N_GEN = 512, 32, 96  # perplexity: every chunk of 512 of the text (1,275 scored ids)


@pytest.fixture(scope="module")
def ids() -> dict[str, list]:
    """The shipped text's ids by frame's tokenizer (the bundled file's): a prompt and perplexity chunks."""
    from frame.model_source import ModelSource

    skip_without_peer()
    tokenizer = ModelSource.open(str(default_model_path()), None, False).tokenizer
    text = token_ids(tokenizer)
    bos = bos_of(tokenizer)
    prompt = ([bos] if bos is not None else []) + text[:PROMPT]
    return {"prompt": prompt, "chunks": chunks(text, N_CTX, bos)}


@pytest.mark.parametrize("preset", PRESETS)
def test_frame_agrees_with_llama_cpp_on_its_own_file(preset: str, ids: dict[str, list], tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    peer = run_peer(default_model_path(), tmp_path / f"smollm2-{preset}.gguf", preset, ids["prompt"], N_GEN,
                    ids["chunks"])
    found = agreement(peer, ids["prompt"], ids["chunks"], caplog=caplog)
    print(found.describe(preset, peer.version), file=sys.stderr)
    assert found.greedy >= 0.9
    assert abs(found.perplexity_ratio - 1) <= 0.01
