"""`frame plugins` lists every model family with the architectures it builds, and names the fallback as such."""

from __future__ import annotations

from frame.cli.plugins_cmd import collect

NATIVE = {
    "llama": {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "GraniteForCausalLM",
              "MixtralForCausalLM"},
    "qwen3": {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"},
    "gemma": {"GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"},
    "phi3": {"Phi3ForCausalLM"},
    "olmo2": {"Olmo2ForCausalLM"},
    "gpt2": {"GPT2LMHeadModel"},
}


def test_model_families_are_listed_with_their_architectures() -> None:
    rows = {r.name: r for r in collect() if r.kind == "model"}
    for family, architectures in NATIVE.items():
        row = rows[family]
        assert row.runs_here and row.wheel == f"frame-model-{family}"
        assert set(row.why.split(", ")) == architectures
    fallback = rows["transformers"]
    assert fallback.runs_here and fallback.why.startswith("fallback: builds any of ")
