"""``frame bench perplexity``: llama.cpp's chunking, and frame's float32 score equal to transformers' on the same
chunks of the shipped text."""

from __future__ import annotations

import json
import math

import pytest
import torch
from frame.bench.perplexity import TEXT, bos_of, chunks, frame_perplexity, score, token_ids
from frame.config import EngineConfig


def test_chunks_are_whole_and_start_with_bos() -> None:
    assert chunks(list(range(10)), 4, 99) == [[99, 1, 2, 3], [99, 5, 6, 7]]
    assert chunks(list(range(10)), 4, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="fewer than one chunk"):
        chunks([1, 2, 3], 4, None)


def test_only_the_second_half_is_scored() -> None:
    logits = torch.zeros(8, 5)
    logits[4:7, 2] = 100.0  # certain of token 2 at positions 4..6, which predict tokens 5..7
    nll, count = score(logits, [0, 0, 0, 0, 0, 2, 2, 2])
    assert count == 3 and nll == pytest.approx(0.0, abs=1e-12)
    nll, _ = score(torch.zeros(8, 5), [0] * 8)
    assert nll == pytest.approx(3 * math.log(5))


def test_the_text_ships_with_frame() -> None:
    assert TEXT.is_file() and "Four score and seven years ago" in TEXT.read_text()


def test_float32_perplexity_is_transformers(hf_reference, smol_source) -> None:
    n_ctx, first = 64, 3
    result = frame_perplexity(EngineConfig(model=str(smol_source.path), dtype="float32", platform="cpu",
                                           quantization="none"), "float32",
                              n_ctx, max_chunks=first)
    tokenizer = smol_source.tokenizer
    pieces = chunks(token_ids(tokenizer), n_ctx, bos_of(tokenizer))[:first]
    nll = count = 0
    with torch.inference_mode():
        for chunk in pieces:
            part, scored = score(hf_reference(torch.tensor([chunk])).logits[0].float(), chunk)
            nll, count = nll + part, count + scored
    assert (result.tokens, result.chunks) == (count, len(pieces))
    assert result.perplexity == pytest.approx(math.exp(nll / count), rel=1e-4)


def test_kv_dtype_variants_score_side_by_side(tmp_path, capsys) -> None:
    from frame.cli.main import main

    text = tmp_path / "text.txt"
    text.write_text(TEXT.read_text()[:4000])
    out = tmp_path / "ppl.json"
    assert main(["bench", "perplexity", "--variant", "bfloat16", "--variant", "bfloat16@int8", "--n-ctx", "256",
                 "--chunks", "2", "--text", str(text), "--json", str(out)]) == 0
    assert "perplexity on text.txt" in capsys.readouterr().out
    bf16, int8 = json.loads(out.read_text())
    assert (bf16["label"], int8["label"]) == ("bfloat16", "bfloat16@int8")
    assert (bf16["chunks"], int8["chunks"]) == (2, 2)
    assert int8["kv_bytes_per_token"] / bf16["kv_bytes_per_token"] == pytest.approx(68 / 128)
    assert int8["perplexity"] == pytest.approx(bf16["perplexity"], rel=0.02)  # 4,096-token numbers: performance.md
