"""The gguf plugin's own behaviour: which tensors stay packed, its options, and splits along the inputs."""

from __future__ import annotations

import pytest
import torch
from frame import default_model_path
from frame.weights import GGMLWeight
from frame_quantization_gguf import GGUFMethod, GGUFOptions, PackedGGUFWeights
from pydantic import ValidationError


def q4_1_weight(rows: int, inputs: int) -> GGMLWeight:
    return GGMLWeight.quantized("q4_1", torch.randn(rows, inputs, generator=torch.Generator().manual_seed(0)))


def test_the_bundled_gguf_keeps_its_blocks() -> None:
    tensors = dict(PackedGGUFWeights(default_model_path()).tensors())
    formats = {name: t.format for name, t in tensors.items() if isinstance(t, GGMLWeight)}
    assert formats["blk.0.ffn_down.weight"] == "q4_1"
    assert formats["token_embd.weight"] == "q8_0"
    assert tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert isinstance(tensors["blk.0.attn_norm.weight"], torch.Tensor)  # f32 vectors stay dense


def test_formats_left_out_of_keep_arrive_dense() -> None:
    tensors = dict(PackedGGUFWeights(default_model_path(), keep=frozenset({"q8_0"})).tensors())
    assert isinstance(tensors["token_embd.weight"], GGMLWeight)
    assert isinstance(tensors["blk.0.ffn_down.weight"], torch.Tensor)


def test_inputs_split_only_on_block_boundaries() -> None:
    weight = q4_1_weight(4, 128)
    torch.testing.assert_close(weight.narrow(-1, 32, 64).dequantize(), weight.dequantize()[:, 32:96])
    with pytest.raises(ValueError, match="multiples of 32"):
        weight.narrow(-1, 16, 64)


def test_blocks_must_fit_the_inputs() -> None:
    weight = q4_1_weight(4, 64)
    with pytest.raises(ValueError, match="do not hold 96 inputs"):
        GGMLWeight("q4_1", weight.tensors["blocks"], 96)


def test_options_name_only_known_formats() -> None:
    with pytest.raises(ValidationError, match="cannot keep iq2_xxs packed"):
        GGUFOptions(keep=["iq2_xxs"])


def test_a_dense_folder_is_refused(tmp_path) -> None:
    reason = GGUFMethod().check(tmp_path, None)
    assert reason is not None and "--quantization int8" in reason
