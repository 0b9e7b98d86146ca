"""The cuda platform: the platform conformance suite, and every detection and choice rule on a simulated GPU.

The simulated GPU monkeypatches ``torch.version`` and the few ``torch.cuda`` functions the platform calls,
so each branch runs on a CPU-only machine; with a real NVIDIA GPU the suite also runs on the device.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from frame.errors import ConfigError, PluginUnavailableError
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.platform import PlatformSuite

_GIB = 1 << 30


class TestCudaConformance(PlatformSuite):
    plugin_name = "cuda"

    def device_memory_bytes(self, platform) -> int:
        return torch.cuda.mem_get_info(platform.device)[1]


@pytest.fixture
def hooks() -> PluginHooks:
    return PluginHooks(PluginRegistry())


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA 12.8 build of torch seeing two GPUs of compute capability 9.0 with 60 of 80 GiB free."""
    state = SimpleNamespace(capability=(9, 0), free=60 * _GIB, total=80 * _GIB, current=None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: state.capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", total_memory=state.total, major=state.capability[0],
        minor=state.capability[1]))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state.free, state.total))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(state, "current", device))
    return state


@pytest.mark.skipif(torch.version.cuda is not None or torch.version.hip is not None, reason="a GPU build of torch")
def test_check_on_a_cpu_only_torch_says_why(hooks):
    assert hooks.platform_check("cuda") == (
        f"torch {torch.__version__} is a CPU-only build, so no CUDA device is visible")
    with pytest.raises(PluginUnavailableError, match=r"The cuda platform cannot run here: torch .* CPU-only build"):
        hooks.create_platform("cuda", None)


def test_check_branches(hooks, monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    monkeypatch.setattr(torch.version, "cuda", None)
    assert hooks.platform_check("cuda") == (
        f"torch {torch.__version__} is a ROCm build, so it drives AMD GPUs; use the rocm platform")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hooks.platform_check("cuda") == (
        f"torch {torch.__version__} is built for CUDA 12.8 but sees no CUDA device "
        "(check the NVIDIA driver and CUDA_VISIBLE_DEVICES)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert hooks.platform_check("cuda") is None


def test_priority_outranks_cpu(hooks):
    assert hooks.platform_priority("cuda") > hooks.platform_priority("cpu") == 0


def test_created_platform_describes_the_device(hooks, fake_gpu):
    platform = hooks.create_platform("cuda", hooks.options_model("platform", "cuda")(device_index=1))
    assert platform.device == torch.device("cuda", 1)
    assert platform.describe() == "NVIDIA H100 80GB HBM3 (80.0 GiB, compute capability 9.0, CUDA 12.8)"
    platform.set_up()
    assert fake_gpu.current == torch.device("cuda", 1)


def test_dtypes_follow_compute_capability(hooks, fake_gpu):
    platform = hooks.create_platform("cuda", None)
    assert list(platform.supported_dtypes) == [torch.bfloat16, torch.float16, torch.float32]
    assert platform.default_dtype == torch.bfloat16
    fake_gpu.capability = (7, 5)
    assert list(platform.supported_dtypes) == [torch.float16, torch.float32]
    assert platform.default_dtype == torch.float16
    assert list(platform.supported_block_sizes()) == [16, 32, 64, 128]


def test_kv_budget_is_a_fraction_of_free_memory_less_weights_and_reserve(hooks, fake_gpu):
    options = hooks.options_model("platform", "cuda")
    platform = hooks.create_platform("cuda", options(reserve_mib=1024))
    assert platform.kv_cache_budget_bytes(0.5, 2 * _GIB) == 30 * _GIB - 2 * _GIB - _GIB
    fake_gpu.free = 10 * _GIB
    assert platform.kv_cache_budget_bytes(0.9, 0) == int(0.9 * 10 * _GIB) - _GIB
    with pytest.raises(ConfigError, match=r"does not hold the 9\.00 GiB of weights"):
        platform.kv_cache_budget_bytes(0.9, 9 * _GIB)


def test_device_index_out_of_range_is_a_config_error(hooks, fake_gpu):
    options = hooks.options_model("platform", "cuda")
    with pytest.raises(ConfigError, match="device_index 2 is out of range: torch sees 2 CUDA device"):
        hooks.create_platform("cuda", options(device_index=2))
    with pytest.raises(ValueError, match="extra"):
        options(gpu=0)


def test_preferred_attention(hooks, fake_gpu, monkeypatch):
    platform = hooks.create_platform("cuda", None)
    assert platform.preferred_attention(["rocm_aiter", "sdpa", "triton"]) == "triton"
    assert platform.preferred_attention(["sdpa"]) == "sdpa"
    assert platform.preferred_attention(["flash"]) == "flash"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert platform.preferred_attention(["sdpa", "triton"]) == "sdpa"
    with pytest.raises(ConfigError, match="No attention backend is installed"):
        platform.preferred_attention([])


def test_tensor_parallel_ranks_take_consecutive_devices(hooks, fake_gpu):
    platform = hooks.create_platform("cuda", None)
    platform.for_rank(1, 2)
    assert platform.device == torch.device("cuda", 1) and platform.distributed_backend == "nccl"
    with pytest.raises(ConfigError, match="rank 2 needs CUDA device 2, but torch sees 2"):
        hooks.create_platform("cuda", None).for_rank(2, 3)


_NO_GPU = not torch.cuda.is_available() or importlib.util.find_spec("triton") is None


@pytest.mark.gpu
@pytest.mark.skipif(_NO_GPU, reason="needs a CUDA device and triton")
def test_cuda_graph_replays_give_the_eager_tokens():
    from frame import LLM, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 5], list(range(100, 140)), [7] * 17]
    outputs = {}
    for graphs in (False, True):
        llm = LLM(platform="cuda", attn="triton", dtype="float32", max_model_len=512, max_num_seqs=8,
                  cuda_graphs=graphs)
        runner = llm.engine.executor.worker.runner
        assert (runner.graphs is not None) == graphs
        outputs[graphs] = [r.outputs[0].token_ids for r in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                                          params)]
    assert outputs[True] == outputs[False]
