"""The rocm platform: the platform conformance suite, and every detection and choice rule on a simulated GPU.

The simulated GPU monkeypatches ``torch.version`` and the few ``torch.cuda`` functions the platform calls
(ROCm builds of torch answer through ``torch.cuda``); AITER's presence is simulated through ``sys.modules``
and ``importlib.util.find_spec``. With a real AMD GPU the suite also runs on the device.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch
from frame.errors import ConfigError, PluginUnavailableError
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.platform import PlatformSuite

_GIB = 1 << 30


class TestRocmConformance(PlatformSuite):
    plugin_name = "rocm"

    def device_memory_bytes(self, platform) -> int:
        return torch.cuda.mem_get_info(platform.device)[1]


@pytest.fixture
def hooks() -> PluginHooks:
    return PluginHooks(PluginRegistry())


@pytest.fixture
def fake_gpu(monkeypatch):
    """A ROCm 6.2 build of torch seeing one MI300X with 150 of 192 GiB free."""
    state = SimpleNamespace(free=150 * _GIB, total=192 * _GIB, current=None)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(
        name="AMD Instinct MI300X", total_memory=state.total, gcnArchName="gfx942:sramecc+:xnack-"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state.free, state.total))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(state, "current", device))
    return state


def _aiter(monkeypatch, state: str) -> None:
    """Make ``aiter`` importable ("ok"), present but failing to import ("broken") or absent ("absent")."""
    real = importlib.util.find_spec
    present = state != "absent"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        SimpleNamespace(name="aiter") if present else None) if name == "aiter" else real(name, *a))
    # None in sys.modules makes `import aiter` raise ImportError.
    monkeypatch.setitem(sys.modules, "aiter", ModuleType("aiter") if state == "ok" else None)


@pytest.mark.skipif(torch.version.cuda is not None or torch.version.hip is not None, reason="a GPU build of torch")
def test_check_on_a_cpu_only_torch_says_why(hooks):
    assert hooks.platform_check("rocm") == (
        f"torch {torch.__version__} is a CPU-only build, so no ROCm device is visible")
    with pytest.raises(PluginUnavailableError, match=r"The rocm platform cannot run here: torch .* CPU-only build"):
        hooks.create_platform("rocm", None)


def test_check_branches(hooks, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert hooks.platform_check("rocm") == (
        f"torch {torch.__version__} is a CUDA build, so it drives NVIDIA GPUs; use the cuda platform")
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hooks.platform_check("rocm") == (
        f"torch {torch.__version__} is built for ROCm 6.2.41133 but sees no AMD GPU "
        "(check access to /dev/kfd and /dev/dri, and HIP_VISIBLE_DEVICES)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hooks.platform_check("rocm") is None


def test_priority_outranks_cpu(hooks):
    assert hooks.platform_priority("rocm") > hooks.platform_priority("cpu") == 0


def test_created_platform_describes_the_device(hooks, fake_gpu):
    platform = hooks.create_platform("rocm", None)
    assert platform.device == torch.device("cuda", 0)
    assert platform.describe() == "AMD Instinct MI300X (192.0 GiB, gfx942, ROCm 6.2.41133)"
    assert list(platform.supported_dtypes) == [torch.bfloat16, torch.float16, torch.float32]
    assert platform.default_dtype == torch.bfloat16
    assert list(platform.supported_block_sizes()) == [16, 32]
    platform.set_up()
    assert fake_gpu.current == torch.device("cuda", 0)


def test_kv_budget_is_a_fraction_of_free_memory_less_weights_and_reserve(hooks, fake_gpu):
    platform = hooks.create_platform("rocm", hooks.options_model("platform", "rocm")(reserve_mib=0))
    assert platform.kv_cache_budget_bytes(0.8, 20 * _GIB) == int(0.8 * 150 * _GIB) - 20 * _GIB
    fake_gpu.free = 1 * _GIB
    with pytest.raises(ConfigError, match="does not hold the"):
        platform.kv_cache_budget_bytes(0.9, _GIB)


def test_device_index_out_of_range_is_a_config_error(hooks, fake_gpu):
    with pytest.raises(ConfigError, match="device_index 1 is out of range: torch sees 1 AMD GPU"):
        hooks.create_platform("rocm", hooks.options_model("platform", "rocm")(device_index=1))


@pytest.mark.parametrize(("aiter", "installed", "expected"), [
    ("ok", ["rocm_aiter", "sdpa", "triton"], "rocm_aiter"),
    ("broken", ["rocm_aiter", "sdpa", "triton"], "triton"),
    ("absent", ["rocm_aiter", "sdpa", "triton"], "triton"),
    ("ok", ["sdpa", "triton"], "triton"),
    ("ok", ["sdpa"], "sdpa"),
    ("absent", ["flash"], "flash"),
])
def test_preferred_attention(hooks, fake_gpu, monkeypatch, aiter, installed, expected):
    _aiter(monkeypatch, aiter)
    assert hooks.create_platform("rocm", None).preferred_attention(installed) == expected


def test_preferred_attention_without_the_triton_package(hooks, fake_gpu, monkeypatch):
    _aiter(monkeypatch, "absent")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("triton", "aiter")
                        else real(name, *a))
    platform = hooks.create_platform("rocm", None)
    assert platform.preferred_attention(["rocm_aiter", "sdpa", "triton"]) == "sdpa"
    with pytest.raises(ConfigError, match="No attention backend is installed"):
        platform.preferred_attention([])
