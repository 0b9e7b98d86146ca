"""The mission's command on a machine without ROCm: one sentence, before any model or process is started."""

from __future__ import annotations

import subprocess
import sys

from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry


def test_serve_with_rocm_aiter_on_this_machine_is_one_sentence() -> None:
    from frame_attention_cpu_paged import kernel

    hooks = PluginHooks(PluginRegistry())
    platform = hooks.create_platform("cpu", None)
    # cpu_paged serves wherever its kernel is built or a compiler can build it.
    serving = "cpu_paged, sdpa" if kernel.unavailable_reason() is None else "sdpa"
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--cache=hashchain", "--attn=rocm_aiter",
                          "--port", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: The attention backend 'rocm_aiter' runs on rocm only, but this machine is {platform.describe()}; "
        f"installed backends that would serve here: {serving}."
    ]
    assert out.stdout == ""


def test_serve_with_a_missing_model_is_one_sentence() -> None:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--model", "/no/such/model", "--port", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: Model path /no/such/model does not exist; pass a Hugging Face folder or a .gguf file to --model."
    ]


def _serve_error(*flags: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--port", "1", *flags],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    return out.stderr.strip().splitlines()


def test_data_parallel_mistakes_are_one_sentence_each() -> None:
    assert _serve_error("--data-parallel-size", "2", "--engine", "inproc") == [
        "error: --engine inproc runs one engine core in the server's thread; drop --engine inproc to serve with "
        "--data-parallel-size 2."]
    assert _serve_error("--data-parallel-size", "2", "--router", "fastest") == [
        "error: No router plugin named 'fastest' is installed; choose one of: least_loaded, prefix_affinity, "
        "round_robin (--router)."]


def test_data_parallel_option_mistakes_name_the_key() -> None:
    import pytest
    from frame.config import build_config
    from frame.engine.client.dp import check_data_parallel
    from frame.errors import ConfigError

    config = build_config(data_parallel_size=2, router="prefix_affinity", router_options={"balance": 3})
    with pytest.raises(ConfigError, match=r"^Unknown router 'prefix_affinity' option key 'balance'; did you mean "
                                          r"'balance_rel'\? valid keys: match_threshold, balance_abs, balance_rel, "
                                          r"max_blocks_per_rank\.$"):
        check_data_parallel("mp", config)
    with pytest.raises(ConfigError, match=r"^Invalid config value for 'data_parallel_size': Input should be greater "
                                          r"than or equal to 1\.$"):
        build_config(data_parallel_size=0)
