"""The gguf plugin's own behaviour: which tensors stay packed (a file mixing types: each in its own), what arrives
dense and the line that says so, its options, and splits along the inputs."""

from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from frame import default_model_path
from frame.weights import GGMLExperts, GGMLWeight
from frame_quantization_gguf import GGUFMethod, GGUFOptions, PackedGGUFWeights
from frame_quantization_gguf.weights import tensor_summary
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
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


#: One tensor of each type of llama.cpp's presets, and two a file may hold that frame does not keep packed.
MIXED = {"q4_0": "blk.0.attn_q", "q4_1": "blk.0.attn_k", "q8_0": "blk.0.attn_v", "q5_0": "blk.0.attn_output",
         "q5_1": "blk.0.ffn_gate", "iq4_nl": "blk.0.ffn_up", "q2_k": "blk.0.ffn_down", "q3_k": "blk.1.attn_q",
         "q4_k": "blk.1.attn_k", "q5_k": "blk.1.attn_v", "q6_k": "blk.1.attn_output", "iq4_xs": "blk.1.ffn_up",
         "iq2_xxs": "blk.1.ffn_gate", "iq2_xs": "blk.2.ffn_gate"}


def write_mixed(path: Path) -> dict[str, np.ndarray]:
    """A GGUF of 16 x 512 matrices, one per type of ``MIXED`` (random bytes, float16 scales at 0.01: valid blocks
    of any of these types), and a 3-D q4_K tensor (experts, as MoE files stack them). Returns each name's bytes."""
    writer = gguf.GGUFWriter(path, "llama")
    rng = np.random.default_rng(0)
    written = {}
    for fmt, stem in MIXED.items():
        qtype = GGMLQuantizationType[fmt.upper()]
        per, size = GGML_QUANT_SIZES[qtype]
        blocks = rng.integers(0, 256, (16, 512 // per, size), dtype=np.uint8)
        scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        at = {"q2_k": [80, 82], "q3_k": [108], "q6_k": [208]}.get(fmt, [0, 2] if fmt in ("q4_1", "q5_1", "q4_k",
                                                                                      "q5_k") else [0])
        for start in at:
            blocks[..., start : start + 2] = scale
        written[f"{stem}.weight"] = blocks.reshape(16, -1)
        writer.add_tensor(f"{stem}.weight", written[f"{stem}.weight"], raw_dtype=qtype)
    experts = np.zeros((2, 16, 2 * 144), dtype=np.uint8)
    writer.add_tensor("blk.0.ffn_down_exps.weight", experts, raw_dtype=GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def test_a_mixed_file_keeps_each_tensor_in_its_own_type(tmp_path: Path, caplog) -> None:
    written = write_mixed(tmp_path / "mixed.gguf")
    with caplog.at_level(logging.WARNING, logger="frame_quantization_gguf"):
        tensors = dict(PackedGGUFWeights(tmp_path / "mixed.gguf").tensors())
    for fmt, stem in MIXED.items():
        tensor, raw = tensors[f"{stem}.weight"], written[f"{stem}.weight"]
        reference = dequantize(raw, GGMLQuantizationType[fmt.upper()])
        if fmt.startswith("iq2"):  # no packed format: dense, as gguf dequantizes it
            assert isinstance(tensor, torch.Tensor)
            np.testing.assert_array_equal(tensor.numpy(), reference)
            continue
        assert isinstance(tensor, GGMLWeight) and tensor.format == fmt and tensor.shape == (16, 512)
        assert np.array_equal(tensor.tensors["blocks"].numpy(), raw)  # the file's bytes, unchanged
        np.testing.assert_array_equal(tensor.dequantize().numpy(), reference)
    experts = tensors["blk.0.ffn_down_exps.weight"]  # an MoE stack stays packed, expert by expert
    assert isinstance(experts, GGMLExperts) and experts.format == "q4_k" and experts.shape == (2, 16, 512)
    assert isinstance(experts[1], GGMLWeight) and experts[1].tensors["blocks"].shape == (16, 288)
    lines = sorted(r.getMessage() for r in caplog.records)
    # One line per type arriving dense, naming the type, why, and the tensors.
    assert lines == [
        "mixed.gguf: 1 iq2_xs tensor dequantized to float32 at load (frame keeps no packed format of this type): "
        "blk.2.ffn_gate.weight",
        "mixed.gguf: 1 iq2_xxs tensor dequantized to float32 at load (frame keeps no packed format of this type): "
        "blk.1.ffn_gate.weight"]


def test_the_dense_tensors_of_a_type_are_named_by_layer_pattern() -> None:
    assert tensor_summary(["blk.0.ffn_down.weight", "blk.1.ffn_down.weight", "output.weight"]) == \
        "blk.*.ffn_down.weight (2), output.weight"
