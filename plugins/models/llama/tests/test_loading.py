"""Checkpoint loading: GGUF files written from a tiny transformers model, the Q/K un-permutation, weight readers."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.model import TINY, PagedRunner, randomize_
from frame.weights import open_weights
from frame_model_llama.args import LlamaArgs
from frame_model_llama.loading import name_map, unpermute_rows
from frame_model_llama.model import LlamaModel
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def llama_cpp_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """What llama.cpp's converter does to Q/K rows (written from its description, independently of the loader)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def write_gguf(model: torch.nn.Module, path: Path, arch: str, permute: bool) -> None:
    """Save ``model`` as a GGUF file with llama.cpp tensor names (float32 and float16 tensors)."""
    config = model.config
    writer = gguf.GGUFWriter(path, arch)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            out = "output.weight"
        elif name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            out = f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"
            if permute and module in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = config.num_attention_heads if "q_proj" in module else config.num_key_value_heads
                tensor = llama_cpp_permute(tensor, heads)
        # Half of the matrices as float16, to exercise both unquantised GGUF types.
        array = tensor.numpy().astype(np.float16 if ".mlp." in name else np.float32)
        writer.add_tensor(out, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(("config", "arch", "permute"), [
    (LlamaConfig(**TINY), "llama", True),
    (Qwen2Config(**TINY), "qwen2", False),
], ids=["llama", "qwen2"])
def test_gguf_checkpoint_matches_transformers(tmp_path: Path, config, arch: str, permute: bool) -> None:
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomize_(reference, seed=7)
    with torch.no_grad():  # the GGUF stores some tensors as float16: compare against the rounded weights
        for name, param in reference.named_parameters():
            if "mlp" in name:
                param.copy_(param.half().float())
    write_gguf(reference, tmp_path / "tiny.gguf", arch, permute)
    args = LlamaArgs.from_config(reference.config)
    hooks = PluginHooks(PluginRegistry())
    attention = hooks.create_attention(
        "sdpa", num_heads=args.num_heads, num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
        scale=args.head_dim**-0.5, dtype=torch.float32, platform=hooks.create_platform("cpu", None), options=None,
    )
    model = LlamaModel(args, attention, torch.device("cpu"), torch.float32)
    source = open_weights(tmp_path / "tiny.gguf")
    assert source.format == "gguf" and len(source) == len(reference.state_dict())
    model.load_weights(source)
    ids = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    logits = PagedRunner(model, attention, 1, 16, torch.float32, torch.device("cpu")).step({0: ids})[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    w = torch.arange(8 * 64 * 3, dtype=torch.float32).reshape(8 * 64, 3)
    for heads in (1, 2, 8):
        permuted = llama_cpp_permute(w, heads)
        assert not torch.equal(permuted, w)
        assert torch.equal(unpermute_rows(permuted, heads), w)


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
