"""Shared fixtures: the bundled model's prompts and the transformers reference, loaded once per session."""

from __future__ import annotations

import pytest

CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Who wrote Pride and Prejudice?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A fresh ``$FRAME_CACHE_DIR`` with the converted-weights cache on for GGUF files of any size."""
    from frame.weights import cache

    monkeypatch.setenv("FRAME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FRAME_WEIGHTS_CACHE", raising=False)
    monkeypatch.setattr(cache, "MIN_BYTES", 0)
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def smol_source():
    from frame.model_source import ModelSource

    return ModelSource.open(None)


@pytest.fixture(scope="session")
def chat_prompts(smol_source) -> list[list[int]]:
    """The eight questions above, as chat-templated token ids."""
    tok = smol_source.tokenizer
    return [
        list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False))
        for q in CHAT_QUESTIONS
    ]


@pytest.fixture(scope="session")
def hf_reference(smol_source):
    """transformers' own load of the same GGUF, in float32: the reference for correctness (from its Hugging Face
    export, which holds transformers' dequantisation of the GGUF as it is)."""
    import torch
    from frame.bench.hf_export import export_folder
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(export_folder(smol_source, torch.float32), dtype=torch.float32).eval()


def _cpu_computes_bfloat16() -> bool:
    """Whether the cpu platform offers bfloat16 on this machine (x86 with AVX2 or AVX-512, Arm; not older x86)."""
    import torch
    from frame.plugins.hooks import PluginHooks
    from frame.plugins.registry import PluginRegistry

    return torch.bfloat16 in PluginHooks(PluginRegistry()).create_platform("cpu", None).supported_dtypes


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``needs_bfloat16`` skip, saying why, on CPUs where the cpu platform offers no bfloat16."""
    marked = [item for item in items if item.get_closest_marker("needs_bfloat16")]
    if marked and not _cpu_computes_bfloat16():
        skip = pytest.mark.skip(reason="the cpu platform offers no bfloat16 on this CPU (neither AVX2 nor Arm)")
        for item in marked:
            item.add_marker(skip)
