"""The mission's command on a machine without ROCm: one sentence, before any model or process is started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from frame.errors import ConfigError
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from transformers import AutoConfig


def test_serve_with_rocm_aiter_on_this_machine_is_one_sentence() -> None:
    from frame_attention_cpu_paged import kernel

    hooks = PluginHooks(PluginRegistry())
    platform = hooks.create_platform("cpu", None)
    # cpu_paged serves wherever its kernel is built or a compiler can build it.
    serving = "cpu_paged, sdpa" if kernel.unavailable_reason() is None else "sdpa"
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--cache=hashchain", "--attn=rocm_aiter",
                          "--port", "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"error: The attention backend 'rocm_aiter' runs on rocm only, but this machine is {platform.describe()}; "
        f"installed backends that would serve here: {serving}."
    ]
    assert out.stdout == ""


def test_serve_with_a_missing_model_is_one_sentence() -> None:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--model", "/no/such/model", "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: Model path /no/such/model does not exist; pass a Hugging Face folder, a .gguf file or a Hub id "
        "(org/name) to --model."
    ]


def _serve_error(*flags: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--port", "0", *flags],
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


def _serve(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", *flags], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_a_port_in_use_fails_in_seconds_before_anything_loads() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        out = _serve("--port", str(port))
        took = time.monotonic() - started
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"error: Port {port} on 127.0.0.1 is already in use; stop what holds it or pass another --port."]
    assert took < 5.0


def test_a_max_model_len_beyond_the_model_is_refused_naming_its_length() -> None:
    assert _serve_error("--max-model-len", "100000") == [
        "error: --max-model-len 100000 is beyond SmolLM2-135M-Instruct's context length of 8192 tokens "
        "(max_position_embeddings in its config); pass at most 8192, or leave it unset."]


def test_the_offline_api_refuses_the_same_length() -> None:
    from frame import LLM

    with pytest.raises(ConfigError, match=r"^--max-model-len 9000 is beyond SmolLM2-135M-Instruct's context length "
                                          r"of 8192 tokens"):
        LLM(max_model_len=9000)


def test_tensor_parallel_with_the_fallback_family_is_one_sentence(tmp_path: Path) -> None:
    config = AutoConfig.for_model("gpt_neox", architectures=["GPTNeoXForCausalLM"], hidden_size=64,
                                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    config.save_pretrained(tmp_path)
    assert _serve_error("--model", str(tmp_path), "--tensor-parallel-size", "2") == [
        "error: The model family 'transformers' is a fallback that runs a model on one rank only; serve it with "
        "--tensor-parallel-size 1 (or install a native family for its architecture)."]


def _excluded(kind: str) -> str:
    names = [p.name for p in PluginRegistry().installed(kind)]
    return (f"error: No {kind} plugin may load: FRAME_PLUGINS excludes every installed one ({', '.join(names)}); add "
            f"the one you need to FRAME_PLUGINS (as {kind}:{names[0]}) or unset the variable.")


def test_an_allow_list_that_leaves_out_a_needed_plugin_says_so() -> None:
    out = _serve("--port", "0", env={"FRAME_PLUGINS": "cache:radix"})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [_excluded("platform")]
    out = _serve("--port", "0", "--cache", "radix", env={"FRAME_PLUGINS": "cache:radix,platform:cpu"})
    assert out.stderr.strip().splitlines() == [_excluded("attention")]
    out = _serve("--port", "0", env={"FRAME_PLUGINS": "cache:radix,platform:cpu,sdpa,fcfs"})
    assert out.stderr.strip().splitlines() == [
        "error: The cache plugin 'hashchain' is installed but it is not listed in FRAME_PLUGINS; add it there or "
        "unset the variable."]
    out = _serve("--port", "0", env={"FRAME_PLUGINS": "hashchain,platform:cpu,sdpa,fcfs"})
    assert out.stderr.strip().splitlines() == [_excluded("model")]


def test_serve_help_shows_defaults_and_explains_the_log_level() -> None:
    from frame.cli import serve
    from frame.engine.client import ENGINE_MODES

    assert serve.ENGINE_MODES == ENGINE_MODES
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--help"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "COLUMNS": "200"})
    text = " ".join(out.stdout.split())
    assert "--port PORT port to listen on (default: 8000)" in text
    assert ("--kv-cache-fraction KV_CACHE_FRACTION share of the device's memory (of RAM on a CPU) the weights and "
            "the KV pool may take together (vLLM's --gpu-memory-utilization) (default: 0.9)") in text
    assert "--cache CACHE KV-cache strategy plugin (default: hashchain)" in text
    assert "--log-level {debug,info,warning,error} how much the server and the engine log" in text
