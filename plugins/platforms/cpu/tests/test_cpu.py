"""The cpu platform: the platform conformance suite plus its options, dtypes and memory budget."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from frame import native
from frame.cli.plugins_cmd import collect
from frame.errors import ConfigError
from frame.testing.platform import PlatformSuite
from frame_platform_cpu import probe
from frame_platform_cpu.platform import CpuOptions, CpuPlatform
from pydantic import ValidationError

_GIB = 1 << 30


class TestCpuConformance(PlatformSuite):
    plugin_name = "cpu"

    def device_memory_bytes(self, platform) -> int:
        return probe.total_memory_bytes()


def test_threads_default_to_every_usable_core_and_set_up_applies_them() -> None:
    before = torch.get_num_threads()
    try:
        assert CpuPlatform().threads == probe.usable_cores()
        platform = CpuPlatform(CpuOptions(threads=1))
        platform.set_up()
        assert torch.get_num_threads() == 1
        assert "1 threads" in platform.describe()
    finally:
        torch.set_num_threads(before)


def test_options_reject_bad_values() -> None:
    with pytest.raises(ValidationError):
        CpuOptions(threads=0)
    with pytest.raises(ValidationError):
        CpuOptions(gpu=True)


def test_kv_budget_is_half_the_available_memory_within_the_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "available_memory_bytes", lambda: 6 * _GIB)
    monkeypatch.setattr(probe, "total_memory_bytes", lambda: 16 * _GIB)
    assert CpuPlatform().kv_cache_budget_bytes(0.9, _GIB) == 3 * _GIB
    assert CpuPlatform().kv_cache_budget_bytes(0.25, _GIB) == 3 * _GIB  # 0.25 x 16 GiB less the weights
    assert CpuPlatform().kv_cache_budget_bytes(0.2, _GIB) == int(0.2 * 16 * _GIB) - _GIB


def test_kv_budget_refuses_a_model_larger_than_the_share() -> None:
    with pytest.raises(ConfigError, match="kv_cache_fraction"):
        CpuPlatform().kv_cache_budget_bytes(0.1, probe.total_memory_bytes())


def test_dtypes_follow_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "cpu_flags", lambda: frozenset({"avx2"}))
    assert list(CpuPlatform().supported_dtypes) == [torch.float32]
    assert CpuPlatform().default_dtype == torch.float32
    monkeypatch.setattr(probe, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16"}))
    assert torch.bfloat16 in CpuPlatform().supported_dtypes
    assert CpuPlatform().default_dtype == torch.bfloat16
    assert "AMX BF16" in CpuPlatform().describe()
    monkeypatch.setattr(probe, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert CpuPlatform().default_dtype == torch.bfloat16
    monkeypatch.setattr(probe, "cpu_flags", lambda: frozenset({"asimd", "bf16"}))  # Arm: supported, not default
    assert torch.bfloat16 in CpuPlatform().supported_dtypes
    assert CpuPlatform().default_dtype == torch.float32


def test_prefers_sdpa_and_needs_some_backend() -> None:
    assert CpuPlatform().preferred_attention(["triton", "sdpa"]) == "sdpa"
    assert CpuPlatform().preferred_attention(["triton"]) == "triton"
    with pytest.raises(ConfigError, match="frame-attention-sdpa"):
        CpuPlatform().preferred_attention([])


_MISSPELT_DISABLE = ("FRAME_CPU_DISABLE names amx, which is not a CPU flag frame can build without; name some of "
                     "amx_bf16, amx_int8, amx_tile, avx2, avx512_bf16, avx512_fp16, avx512_vnni, avx512bw, avx512f, "
                     "fma (comma-separated), or unset it.")


def test_a_misspelt_flag_to_disable_stops_the_platform_in_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    # `amx` for `amx_tile` used to leave the kernels' availability check saying "unavailable", so every native
    # kernel was quietly off and the run measured torch's code instead.
    monkeypatch.setenv(native.DISABLE_ENV, "amx")
    with pytest.raises(ConfigError) as raised:
        CpuPlatform()
    assert str(raised.value) == _MISSPELT_DISABLE
    cpu = next(r for r in collect() if r.kind == "platform" and r.name == "cpu")
    assert (cpu.runs_here, cpu.why) == (False, _MISSPELT_DISABLE)
    monkeypatch.setenv(native.DISABLE_ENV, "amx_tile")  # the flag meant: the platform starts
    assert CpuPlatform().threads >= 1


def test_serve_with_a_misspelt_flag_to_disable_is_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "frame.cli.main", "serve", "--port", "0"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, native.DISABLE_ENV: "amx"})
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.strip().splitlines() == [f"error: {_MISSPELT_DISABLE}"]
