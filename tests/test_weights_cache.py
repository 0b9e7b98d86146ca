"""The converted-weights cache: a GGUF's dequantised tensors saved as safetensors and read back unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from frame.weights import cache, open_weights
from frame.weights.gguf import GGUFWeights


def _write(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("token_embd.weight", rng.standard_normal((8, 4), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", rng.standard_normal((6, 4)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_second_open_reads_the_cache_and_gets_the_same_tensors(tmp_path: Path, cache_dir: Path) -> None:
    _write(tmp_path / "m.gguf", seed=1)
    first = open_weights(tmp_path / "m.gguf")
    assert isinstance(first, cache.CachingGGUFWeights)
    expected = dict(first.tensors())
    second = open_weights(tmp_path / "m.gguf")
    assert isinstance(second, cache.CachedGGUFWeights) and second.format == "gguf" and len(second) == 2
    got = dict(second.tensors())
    assert list(got) == list(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor)


def test_a_changed_file_is_converted_again(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path, seed=1)
    dict(open_weights(path).tensors())
    _write(path, seed=2)
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    source = open_weights(path)
    assert isinstance(source, cache.CachingGGUFWeights)
    assert torch.equal(dict(source.tensors())["token_embd.weight"],
                       dict(GGUFWeights(path).tensors())["token_embd.weight"])


def test_disabled_or_unreadable_cache_falls_back_to_the_file(tmp_path: Path, cache_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.gguf"
    _write(path, seed=1)
    folder = cache.cache_folder(path)
    folder.mkdir(parents=True)
    (folder / "weights.safetensors").write_bytes(b"not a safetensors file")
    assert isinstance(open_weights(path), cache.CachingGGUFWeights)
    monkeypatch.setenv("FRAME_WEIGHTS_CACHE", "0")
    assert type(open_weights(path)) is GGUFWeights
