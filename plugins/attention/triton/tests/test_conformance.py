"""frame's attention conformance suite and the plugin's hooks, through the registry like the engine uses them.

With a GPU the suite runs on the ``cuda`` platform (``rocm`` builds of torch also report through torch.cuda);
without one it runs the kernels under the Triton interpreter on the ``cpu`` platform (see conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention import AttentionBackendSuite

HAS_GPU = torch.cuda.is_available()
ROCM = torch.version.hip is not None


class TestTritonConformance(AttentionBackendSuite):
    plugin_name = "triton"
    platform_name = ("rocm" if ROCM else "cuda") if HAS_GPU else "cpu"
    block_sizes = (16, 32)

    def low_precision_dtypes(self, platform) -> list[torch.dtype]:
        dtypes = super().low_precision_dtypes(platform)
        # The Triton interpreter computes bfloat16 tl.dot wrongly: bfloat16 is checked on GPU only.
        return dtypes if HAS_GPU else [d for d in dtypes if d != torch.bfloat16]


@pytest.fixture
def hooks() -> PluginHooks:
    return PluginHooks(PluginRegistry())


def test_platforms_and_check(hooks, monkeypatch):
    cpu = hooks.create_platform("cpu", None)
    cpu.name = "cpu"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert hooks.attention_platforms("triton") == ["cuda", "rocm"]
    reason = hooks.attention_check("triton", cpu)
    assert reason == ("the triton kernels run on a CUDA or ROCm GPU, not on the 'cpu' platform "
                      "(on the CPU only under TRITON_INTERPRET=1, for tests)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert hooks.attention_platforms("triton") == ["cuda", "rocm", "cpu"]
    assert hooks.attention_check("triton", cpu) is None


def test_check_names_a_missing_triton(hooks, monkeypatch):
    import importlib.util

    cpu = hooks.create_platform("cpu", None)
    cpu.name = "cpu"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert hooks.attention_check("triton", cpu) == "the triton package is not installed; pip install triton"


def test_options_are_validated(hooks):
    options = hooks.options_model("attention", "triton")
    assert options().prefill_block_m == 64
    assert options(prefill_block_m=32).prefill_block_m == 32
    with pytest.raises(ValueError, match="power of two"):
        options(prefill_block_m=48)
    backend = hooks.create_attention("triton", num_heads=4, num_kv_heads=2, head_dim=64, scale=0.125,
                                     dtype=torch.float16, platform=hooks.create_platform("cpu", None),
                                     options=options(prefill_block_m=128))
    assert backend.options.prefill_block_m == 128 and backend.group == 2
