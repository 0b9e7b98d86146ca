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
