"""GGUF files as llama.cpp's converter writes them: the config, tokenizer, special tokens and chat template come from
the file; an architecture no family serves and a file cut short are one sentence each; a .gguf runs packed by
default."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
from frame.config import EngineConfig
from frame.engine.selection import select_quantization
from frame.errors import ModelNotFoundError, UnsupportedModelError
from frame.model_source import ModelSource
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.gguf import CHAT_TEMPLATE, SPECIAL_TOKENS, write_tiny_tokenizer
from frame.weights import open_weights
from frame.weights.gguf_config import ARCHITECTURES

VOCAB = 40


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path / "cache"))


#: A Gemma-style sentencepiece vocabulary: specials, then pieces with their scores.
SPM_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\u2581", "a", "b", "c",
              "\u2581a", "\u2581b", "ab"]
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                  "<end_of_turn>\n{% endfor %}")


def write_spm_tokenizer(writer: gguf.GGUFWriter) -> list[str]:
    """The converter's sentencepiece vocabulary (``tokenizer.ggml.model`` ``llama``), Gemma's special tokens."""
    kinds = gguf.TokenType
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(SPM_TOKENS)
    writer.add_token_scores([0.0] * 6 + [-1.0, -2.0, -3.0, -4.0, -1.5, -1.6, -1.7])
    writer.add_token_types([int(k) for k in [kinds.CONTROL] * 3 + [kinds.UNKNOWN] + [kinds.USER_DEFINED] * 2]
                           + [int(kinds.NORMAL)] * 7)
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_bos_token_id(2)
    writer.add_unk_token_id(3)
    writer.add_chat_template(GEMMA_TEMPLATE)
    return SPM_TOKENS


def write_file(path: Path, arch: str, keys: bool = True,
               vocabulary: Callable[[gguf.GGUFWriter], list[str]] = lambda w: write_tiny_tokenizer(w, VOCAB)) -> Path:
    """A two-layer GGUF of llama.cpp architecture ``arch`` with a tokenizer and Llama-shaped tensors."""
    writer = gguf.GGUFWriter(path, arch)
    if keys:
        writer.add_block_count(2)
        writer.add_context_length(64)
        writer.add_embedding_length(32)
        writer.add_feed_forward_length(64)
        writer.add_head_count(2)
        writer.add_head_count_kv(1)
        writer.add_layer_norm_rms_eps(1e-6)
    if keys and arch == "gemma3":
        writer.add_sliding_window(4)
    tokens = vocabulary(writer)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), 32), dtype=np.float32))
    for layer in range(2):
        for name, shape in (("attn_q", (32, 32)), ("attn_k", (16, 32)), ("attn_v", (16, 32)),
                            ("attn_output", (32, 32)), ("ffn_gate", (64, 32)), ("ffn_up", (64, 32)),
                            ("ffn_down", (32, 64)), ("attn_norm", (32,)), ("ffn_norm", (32,))):
            writer.add_tensor(f"blk.{layer}.{name}.weight", rng.standard_normal(shape, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["llama", "olmo2"])  # olmo2: a file transformers' own GGUF reader refuses
def test_tokenizer_special_tokens_and_chat_template_come_from_the_file(tmp_path: Path, arch: str) -> None:
    source = ModelSource.open(str(write_file(tmp_path / f"tiny-{arch}.gguf", arch)))
    assert source.architecture == ARCHITECTURES[arch][1][source.hf_config.model_type]
    config = source.hf_config
    assert (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads, config.head_dim,
            config.tie_word_embeddings, config.vocab_size) == (2, 32, 1, 16, True, VOCAB)
    tokenizer = source.tokenizer
    ids = tokenizer("ab c").input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == ["ab", "Ġ", "c"]
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == SPECIAL_TOKENS
    assert source.eos_token_ids == frozenset({2})
    assert tokenizer.chat_template == CHAT_TEMPLATE
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "<s>user:hi</s>"
    assert tokenizer("<s>hi</s>").input_ids[0] == 1  # special tokens stay whole


def test_a_gemma3_file_with_a_sentencepiece_vocabulary(tmp_path: Path) -> None:
    """The issue's case: llama.cpp's ``gemma3`` is the gemma family's Gemma 3 text model, five local layers in six
    (both local here: two layers), and its sentencepiece tokenizer is Gemma's, adding BOS, with the file's
    template."""
    source = ModelSource.open(str(write_file(tmp_path / "tiny-gemma3.gguf", "gemma3", vocabulary=write_spm_tokenizer)))
    assert source.architecture == "Gemma3ForCausalLM"
    assert source.hf_config.layer_types == ["sliding_attention", "sliding_attention"]
    assert source.hf_config.sliding_window == 4
    tokenizer = source.tokenizer
    assert tokenizer.convert_ids_to_tokens(tokenizer("a b").input_ids) == ["<bos>", "a", "\u2581b"]
    assert source.eos_token_ids == frozenset({1})
    assert tokenizer.apply_chat_template([{"role": "user", "content": "ab"}], tokenize=False) == (
        "<bos><start_of_turn>user\nab<end_of_turn>\n")


def test_an_architecture_no_family_reads_is_one_sentence(tmp_path: Path) -> None:
    path = write_file(tmp_path / "tiny-mamba.gguf", "mamba", keys=False)
    with pytest.raises(UnsupportedModelError) as err:
        _ = ModelSource.open(str(path)).hf_config
    readable = ", ".join(sorted(ARCHITECTURES))
    assert str(err.value) == (
        f"tiny-mamba.gguf is a GGUF of llama.cpp architecture 'mamba', which no frame model family reads (it reads "
        f"GGUF files of {readable}); serve the model's Hugging Face checkpoint folder (config.json and "
        f"*.safetensors) instead, which the transformers fallback family may run.")


def test_a_file_without_a_key_every_converted_model_has_is_one_sentence(tmp_path: Path) -> None:
    path = write_file(tmp_path / "bare.gguf", "llama", keys=False)
    with pytest.raises(UnsupportedModelError) as err:
        _ = ModelSource.open(str(path)).hf_config
    assert str(err.value) == ("bare.gguf lacks llama.attention.head_count, which llama.cpp's converter writes; "
                              "convert the checkpoint again with llama.cpp's converter.")


def test_a_truncated_file_is_one_sentence_on_the_command_line(tmp_path: Path) -> None:
    whole = write_file(tmp_path / "whole.gguf", "llama")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-100])
    size = cut.stat().st_size
    expected = (f"cut.gguf is shorter than its tensor table says (tensor 'output_norm.weight' ends at byte "
                f"{size + 100:,}, the file has {size:,}): the download was cut short; download the file again.")
    with pytest.raises(ModelNotFoundError, match="cut short") as err:
        open_weights(cut)
    assert str(err.value) == expected
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "generate", "--model", str(cut), "--prompt", "hello"],
                         capture_output=True, text=True, timeout=180, env=os.environ.copy())
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"error: {expected}"


def test_a_gguf_runs_packed_by_default_and_dense_when_asked(tmp_path: Path) -> None:
    hooks = PluginHooks(PluginRegistry())
    path = write_file(tmp_path / "tiny.gguf", "llama")
    source = ModelSource.open(str(path))
    method = select_quantization(hooks, EngineConfig(model=str(path)), source)
    assert method is not None and method.name == "gguf"
    assert select_quantization(hooks, EngineConfig(model=str(path), quantization="none"), source) is None
    # A platform without ggml kernels would dequantise every call: dense weights instead.
    torch_only = hooks.create_platform("cpu", hooks.options_model("platform", "cpu")(native_kernels=False))
    assert select_quantization(hooks, EngineConfig(model=str(path)), source, torch_only) is None
