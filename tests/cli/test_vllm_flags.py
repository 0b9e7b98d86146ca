"""vLLM's flag names set the EngineConfig keys they stand for, a contradiction with frame's own flag is one
sentence, and a Hub id that is not in the cache is one sentence (tests/server/test_first_hour.py serves with them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from frame.cli.main import build_parser
from frame.cli.serve import chat_template, serve_config
from frame.config import EngineConfig
from frame.errors import ConfigError


def _config(*argv: str) -> EngineConfig:
    return serve_config(build_parser().parse_args(["serve", *argv]))


def test_prefix_caching_flags_choose_the_cache_strategy() -> None:
    assert _config("--no-enable-prefix-caching").cache == "none"
    assert _config("--enable-prefix-caching").cache == "hashchain"
    assert _config("--enable-prefix-caching", "--cache", "radix").cache == "radix"
    with pytest.raises(ConfigError, match=r"^--no-enable-prefix-caching and --cache radix ask for different cache "
                                          r"values; give one of them\.$"):
        _config("--no-enable-prefix-caching", "--cache", "radix")
    with pytest.raises(ConfigError, match=r"^--enable-prefix-caching and --cache none contradict each other; drop "
                                          r"one\.$"):
        _config("--enable-prefix-caching", "--cache", "none")


def test_enforce_eager_turns_decode_graphs_off() -> None:
    assert _config().cuda_graphs is True
    assert _config("--enforce-eager").cuda_graphs is False
    with pytest.raises(ConfigError, match=r"^--enforce-eager and --cuda-graphs ask for different cuda_graphs "
                                          r"values; give one of them\.$"):
        _config("--enforce-eager", "--cuda-graphs")


def test_gpu_memory_utilization_is_the_kv_cache_fraction() -> None:
    assert _config("--gpu-memory-utilization", "0.5").kv_cache_fraction == 0.5
    with pytest.raises(ConfigError, match=r"^Invalid config value for 'kv_cache_fraction': Input should be less "
                                          r"than or equal to 1"):
        _config("--gpu-memory-utilization", "1.5")


def test_dtype_takes_vllms_spellings() -> None:
    assert _config("--dtype", "half").dtype == "float16"
    assert _config("--dtype", "float").dtype == "float32"
    assert _config("--dtype", "bfloat16").dtype == "bfloat16"


def test_dtype_half_where_the_platform_lacks_float16_is_one_sentence() -> None:
    import torch
    from frame.engine.selection import select_dtype
    from frame.plugins.hooks import PluginHooks
    from frame.plugins.registry import PluginRegistry

    hooks = PluginHooks(PluginRegistry())
    platform = hooks.create_platform("cpu", None)
    config = _config("--dtype", "half")
    if torch.float16 in platform.supported_dtypes:
        assert select_dtype(config, platform) == torch.float16
        return
    names = ", ".join(str(d).removeprefix("torch.") for d in platform.supported_dtypes)
    with pytest.raises(ConfigError) as refused:
        select_dtype(config, platform)
    assert str(refused.value) == f"dtype float16 is not supported on {platform.describe()}; use one of: {names}."


def test_the_model_may_come_first_without_a_flag() -> None:
    assert _config("org/model").model == "org/model"
    assert _config("org/model", "--model", "org/model").model == "org/model"
    with pytest.raises(ConfigError, match=r"^the positional model org/a and --model org/b ask for different model "
                                          r"values; give one of them\.$"):
        _config("org/a", "--model", "org/b")


def test_chat_template_reads_a_file_or_takes_the_template(tmp_path: Path) -> None:
    file = tmp_path / "t.jinja"
    file.write_text("{{ messages[0]['content'] }}")
    assert chat_template(str(file)) == "{{ messages[0]['content'] }}"
    assert chat_template("{{ messages[-1]['content'] }}") == "{{ messages[-1]['content'] }}"
    assert chat_template(None) is None
    with pytest.raises(ConfigError, match=r"^Chat template file /no/such.jinja does not exist; pass an existing file "
                                          r"or the template itself to --chat-template\.$"):
        chat_template("/no/such.jinja")


def test_an_uncached_hub_id_offline_is_one_sentence(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "Qwen/Qwen2-0.5B-Instruct", "--port", "0"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"error: Qwen/Qwen2-0.5B-Instruct is not in the Hugging Face cache ({tmp_path}/hub), and HF_HUB_OFFLINE=1 "
        "forbids downloading it; download it where the network allows (hf download Qwen/Qwen2-0.5B-Instruct) or "
        "pass a local folder."]
