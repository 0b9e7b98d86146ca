"""Checkpoint loading: the Q/K un-permutation, the name maps, weight readers (GGUF files of every family are the
conformance suite's, :mod:`frame.testing.model`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from frame.testing.gguf import llama_cpp_permute
from frame.testing.model import TINY
from frame.weights import GGMLWeight, open_weights
from frame.weights.reordered import ReorderedRows
from frame_model_llama.args import LlamaArgs
from frame_model_llama.loading import name_map, unpermute_rows
from transformers import LlamaConfig


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = torch.arange(8 * 64 * 3, dtype=torch.float32).reshape(8 * 64, 3)
    for heads in (1, 2, 8):
        permuted = llama_cpp_permute(w, heads)
        assert not torch.equal(permuted, w)
        assert torch.equal(unpermute_rows(permuted, heads), w)


def test_packed_qk_rows_are_reordered_without_a_copy_that_stays() -> None:
    """A GGUF's packed Q/K rows keep the file's blocks: the Hugging Face order is made only when read."""
    dense = torch.randn(8 * 16, 64)
    permuted = GGMLWeight.quantized("q8_0", llama_cpp_permute(dense, 8))
    restored = unpermute_rows(permuted, 8)
    assert isinstance(restored, ReorderedRows) and restored.source is permuted
    assert next(iter(restored.file_views())) is permuted.tensors["blocks"]
    assert torch.equal(restored.dequantize(), GGMLWeight.quantized("q8_0", dense).dequantize())


def test_names_map_to_layers_and_fused_parts() -> None:
    args = LlamaArgs.from_config(LlamaConfig(**TINY))
    hf, gguf = name_map(args, gguf=False), name_map(args, gguf=True)
    assert hf.target("model.layers.1.self_attn.k_proj.weight") == ("layers.1.attn.qkv", "weight", "k")
    assert gguf.target("blk.0.attn_v.weight") == ("layers.0.attn.qkv", "weight", "v")
    assert gguf.target("blk.1.ffn_up.weight") == ("layers.1.mlp.gate_up", "weight", "up")
    assert gguf.target("blk.1.attn_norm.weight") == ("layers.1.input_norm", "weight", None)
    assert gguf.target("output.weight") == ("lm_head", "weight", None)
    assert gguf.target("rope_freqs.weight") is None
    with pytest.raises(ValueError, match=r"blk\.2\.attn_q\.weight"):
        gguf.target("blk.2.attn_q.weight")  # the model has 2 layers


def test_weight_readers_refuse_pickles_and_odd_paths(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="pickled weights"):
        open_weights(tmp_path)
    with pytest.raises(ValueError, match="neither"):
        open_weights(tmp_path / "pytorch_model.bin")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        open_weights(empty)
