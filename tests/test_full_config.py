"""A checkpoint's config, completed with its transformers class's defaults, reads back as that class would hold it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from frame.weights import full_config
from frame.weights.full_config import (
    concrete_config,
    folder_config,
    read_full_config,
    with_class_defaults,
    with_class_defaults_here,
)
from frame.weights.gguf_config import ARCHITECTURES
from transformers import AutoConfig, PretrainedConfig

#: Every model type a GGUF's config is rebuilt as (frame.weights.gguf_config), with what its builder writes.
MODEL_TYPES = sorted({model_type for _, types in ARCHITECTURES.values() for model_type in types})
SIZES = {"vocab_size": 60000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
GPT2_SIZES = {"vocab_size": 60000, "n_embd": 64, "n_layer": 4, "n_head": 4, "n_positions": 512}


def _written(model_type: str) -> dict:
    return {"model_type": model_type, **(GPT2_SIZES if model_type == "gpt2" else SIZES)}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_attribute_of_the_class_reads_back_from_a_plain_config(model_type: str, tmp_path) -> None:
    written = _written(model_type)
    (tmp_path / "config.json").write_text(json.dumps(with_class_defaults_here(written)))
    plain = read_full_config(tmp_path / "config.json")
    assert type(plain) is PretrainedConfig
    fields = dict(written)
    reference = AutoConfig.for_model(fields.pop("model_type"), **fields)
    names = [*reference.to_dict(), *type(reference).attribute_map]  # GPT-2's hidden_size is its n_embd
    assert plain.model_type == model_type
    for name in names:
        if name in ("model_type", "transformers_version", "use_cache"):  # a plain config drops use_cache; frame
            continue                                                      # never reads it
        assert getattr(plain, name) == getattr(reference, name), name


def test_the_child_process_completes_the_config_as_this_one_does(monkeypatch) -> None:
    monkeypatch.setattr(full_config, "_class_imported", lambda model_type: False)
    here = json.loads(json.dumps(with_class_defaults_here(_written("qwen3"))))  # as config.json holds it
    assert with_class_defaults(_written("qwen3")) == here


def test_a_plain_config_becomes_its_class_again(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(with_class_defaults_here(_written("gemma3_text"))))
    config = concrete_config(read_full_config(tmp_path / "config.json"))
    assert type(config).__name__ == "Gemma3TextConfig"
    assert config.hidden_activation == "gelu_pytorch_tanh" and config.num_key_value_heads == 2


def test_reading_a_gguf_config_leaves_transformers_config_class_unimported(tmp_path) -> None:
    """The class's module imports much of transformers (60 MiB resident on a Zen 5); an engine serving a GGUF reads
    the config frame wrote without it, the first time (the class runs in a child) and every time after."""
    program = (
        "import sys\n"
        "from frame.model_source import ModelSource, default_model_path\n"
        "config = ModelSource(default_model_path(), 'smollm2').hf_config\n"
        "assert config.hidden_act == 'silu' and config.num_key_value_heads == 3, config\n"
        "print(sorted(m for m in sys.modules if m.startswith('transformers.models.llama')))\n"
    )
    env = {**os.environ, "FRAME_CACHE_DIR": str(tmp_path)}
    for _ in range(2):  # written, then read from the cache
        run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == "[]"


def _folder(tmp_path, config: dict):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_folders_config_reads_back_plain_from_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path / "cache"))
    folder = _folder(tmp_path, {**_written("qwen2"), "architectures": ["Qwen2ForCausalLM"]})
    plain = folder_config(folder)
    assert type(plain) is PretrainedConfig and plain.hidden_act == "silu" and plain.use_sliding_window is False
    assert plain.layer_types == ["full_attention"] * 4 and plain.architectures == ["Qwen2ForCausalLM"]
    monkeypatch.setattr(full_config, "with_class_defaults", None)  # the second read is the cache's alone
    assert folder_config(folder).to_dict() == plain.to_dict()


@pytest.mark.parametrize("config", [
    {"model_type": "gemma3", "text_config": {"hidden_size": 64}},  # nests a text config of its own class
    {**SIZES, "model_type": "llama", "quantization_config": {"quant_method": "gptq", "bits": 4}},
    {**SIZES, "model_type": "frame-no-such-model"},
], ids=["nested", "quantized", "unknown"])
def test_a_folder_whose_config_a_plain_one_cannot_hold_is_left_to_autoconfig(config, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path / "cache"))
    assert folder_config(_folder(tmp_path, config)) is None


#: Configs as Hub checkpoints write them: rope scaling in its older key, a longrope's factors, a window.
HUB_STYLE = {
    "llama3": {**SIZES, "model_type": "llama", "rope_theta": 500000.0, "tie_word_embeddings": True,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "phi3_longrope": {**SIZES, "model_type": "phi3", "original_max_position_embeddings": 256, "sliding_window": 128,
                      "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
    "mistral_window": {**SIZES, "model_type": "mistral", "sliding_window": 64, "head_dim": 16},
}


@pytest.mark.parametrize("name", sorted(HUB_STYLE))
def test_a_hub_style_config_reads_back_as_its_class_would(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path / "cache"))
    config = HUB_STYLE[name]
    plain = folder_config(_folder(tmp_path, config))
    fields = dict(config)
    reference = AutoConfig.for_model(fields.pop("model_type"), **fields)
    for key in reference.to_dict():
        if key not in ("model_type", "transformers_version", "use_cache"):
            assert getattr(plain, key) == getattr(reference, key), key
