"""frame.layers' shared blocks and frame.weights' name maps, checked against direct computations, and the engine's
refusal of a backend that cannot serve a layer's window (issue 18)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from frame import hookimpl
from frame.engine.worker.attention_layers import create_layer_attention, family_specs
from frame.errors import PluginUnavailableError, UnsupportedModelError
from frame.interfaces.attention import AttentionBackend, AttentionSpec
from frame.layers import (
    FamilyOptions,
    HeadNorm,
    MixtureOfExperts,
    RotaryEmbedding,
    SelfAttention,
    check_common,
    kv_cache_layout,
    kv_cache_spec,
    layer_windows,
)
from frame.parallel import HeadPartition
from frame.plugins.hooks import PluginHooks
from frame.plugins.registry import PluginRegistry
from frame.testing.attention import build_metadata, reference_attention
from frame.testing.registration import plugin_module, registered
from frame.weights.names import NameMap
from transformers import MistralConfig, Qwen2Config

CPU = torch.device("cpu")


def randomize(module: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_mixture_of_experts_equals_a_direct_computation(scoring: str) -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(16, 8, 4, 2, CPU, torch.float32, scoring=scoring, routed_scale=2.5,
                           shared_intermediate=12, shared_gate=True)
    randomize(moe)
    x = torch.randn(5, 16)
    scores = torch.softmax(x @ moe.router.gate.weight.T, -1) if scoring == "softmax" else torch.sigmoid(
        x @ moe.router.gate.weight.T)
    expected = torch.zeros_like(x)
    w13, w2 = moe.experts.w13, moe.experts.w2
    for t in range(5):
        weights, ids = torch.topk(scores[t], 2)
        for w, e in zip((weights / weights.sum() * 2.5).tolist(), ids.tolist(), strict=True):
            gate, up = (w13[e] @ x[t]).chunk(2)
            expected[t] += w * (w2[e] @ (F.silu(gate) * up))
    shared = moe.shared_expert
    gate, up = F.linear(x, shared.gate_up.weight).chunk(2, -1)
    expected += torch.sigmoid(x @ moe.shared_expert_gate.weight.T) * F.linear(F.silu(gate) * up,
                                                                               shared.down_proj.weight)
    torch.testing.assert_close(moe(x), expected, atol=1e-5, rtol=1e-5)


def test_experts_take_a_platform_kernel_and_fall_back_when_it_declines() -> None:
    moe = MixtureOfExperts(8, 4, 2, 1, CPU, torch.float32)
    randomize(moe)
    x = torch.randn(3, 8)
    plain = moe(x)
    moe.experts.kernel = lambda x, ids, weights: None  # declines: the torch reference runs
    torch.testing.assert_close(moe(x), plain)
    moe.experts.kernel = lambda x, ids, weights: torch.full_like(x, 7.0)
    assert torch.equal(moe(x), torch.full_like(x, 7.0))


def test_head_norm_across_heads_and_per_head() -> None:
    heads = HeadPartition.of(4, 2, 1, 0)
    across, _ = HeadNorm.for_queries_and_keys(8, 4, 2, heads, 1e-6, per_head=False, device=CPU, dtype=torch.float32,
                                              upcast=True)
    per_head, _ = HeadNorm.for_queries_and_keys(8, 4, 2, heads, 1e-6, per_head=True, device=CPU, dtype=torch.float32)
    randomize(across)
    randomize(per_head, seed=1)
    x = torch.randn(3, 4, 8)
    flat = x.reshape(3, 32)
    expected_across = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + 1e-6) * across.weight
    expected_per_head = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * per_head.weight
    a, b = x.clone(), x.clone()
    across(a)
    per_head(b)
    torch.testing.assert_close(a.reshape(3, 32), expected_across)
    torch.testing.assert_close(b, expected_per_head)


def test_a_layer_that_shares_kv_reads_its_source_and_writes_nothing() -> None:
    specs = [AttentionSpec(4, 2, 8, 0.3), AttentionSpec(4, 2, 8, 0.3, kv_source=0), AttentionSpec(4, 2, 8, 0.3)]
    assert kv_cache_layout(specs) == [0, 0, 1] and kv_cache_spec(specs).num_layers == 2
    hooks = PluginHooks(PluginRegistry())
    backend = create_layer_attention(hooks, "sdpa", specs[:1], world_size=1, rank=0, dtype=torch.float32,
                                     platform=hooks.create_platform("cpu", None), options=None)[0]
    writer = SelfAttention(16, specs[0], backend, CPU, torch.float32, rotary_dim=0)
    reader = SelfAttention(16, specs[1], backend, CPU, torch.float32, rotary_dim=0)
    randomize(writer)
    randomize(reader, seed=2)
    assert reader.qkv.load_parts() == ["q"]  # queries only
    caches = torch.zeros(2, 3, 4, 2, 8)
    meta = backend.build_metadata(build_metadata([0], [5], [[2, 0]], 4))
    x = torch.randn(5, 16)
    writer(x, None, (caches[0], caches[1]), meta)
    written = caches.clone()
    out = reader(x, None, (caches[0], caches[1]), meta)
    assert torch.equal(caches, written)
    q = F.linear(x, reader.qkv.weight).view(5, 4, 8)
    k, v = F.linear(x, writer.qkv.weight)[:, 32:].view(5, 2, 2, 8).unbind(1)
    attended = reference_attention(q, k, v, caches[0], caches[1], meta, 0.3)
    torch.testing.assert_close(out, F.linear(attended.reshape(5, 32), reader.o_proj.weight), atol=1e-5, rtol=1e-5)


def test_name_maps_place_experts_stacks_and_refuse_strangers() -> None:
    hf = NameMap.hf(2, "TestLM", layer={"mlp.gate": ("mlp.router.gate", None)},
                    patterns={r"mlp\.experts\.(\d+)\.(gate|up|down)_proj": ("mlp.experts", r"\1.\2")})
    assert hf.target("model.layers.1.mlp.experts.3.down_proj.weight") == ("layers.1.mlp.experts", "weight", "3.down")
    assert hf.target("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    with pytest.raises(ValueError, match=r"'model\.layers\.2\.mlp\.gate\.weight' has no place in TestLM"):
        hf.target("model.layers.2.mlp.gate.weight")
    gguf = NameMap.gguf(2, "TestLM", layer={"ffn_up_exps": ("mlp.experts", "*.up")})
    stack = torch.arange(3 * 2 * 4.0).reshape(3, 2, 4)
    placed = gguf.place("blk.0.ffn_up_exps.weight", stack)
    assert [t for t, _ in placed] == [("layers.0.mlp.experts", "weight", f"{e}.up") for e in range(3)]
    assert all(torch.equal(piece, stack[e]) for e, (_, piece) in enumerate(placed))


def test_longrope_rotates_early_positions_with_short_factors_and_later_ones_with_long() -> None:
    rope = {"rope_type": "longrope", "rope_theta": 100.0, "partial_rotary_factor": 0.5, "short_factor": [1.0, 2.0],
            "long_factor": [4.0, 8.0], "original_max_position_embeddings": 4}
    table = RotaryEmbedding(rope, 8, 8, CPU)
    assert table.rotary_dim == 4
    factor = (1 + torch.log(torch.tensor(2.0)) / torch.log(torch.tensor(4.0))).sqrt()
    base = 100.0 ** (torch.arange(0, 4, 2) / 4)
    for position, factors in ((3, [1.0, 2.0]), (5, [4.0, 8.0])):
        expected = torch.cos(position / (torch.tensor(factors) * base)) * factor
        torch.testing.assert_close(table.cos[position], expected)


def test_windows_come_from_layer_types_or_every_layer_and_can_be_switched_off() -> None:
    qwen = Qwen2Config(num_hidden_layers=3, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    assert layer_windows(qwen, "test") == [None, 16, 16]
    assert layer_windows(MistralConfig(num_hidden_layers=2, sliding_window=32), "test") == [32, 32]
    assert layer_windows(qwen, "test", FamilyOptions(disable_sliding_window=True)) == [None, None, None]
    qwen.layer_types = ["full_attention", "chunked_attention", "full_attention"]
    with pytest.raises(UnsupportedModelError, match="layer_types='chunked_attention'"):
        layer_windows(qwen, "test")


def test_a_quantization_config_without_a_loader_is_one_sentence_and_gguf_is_loaded() -> None:
    config = MistralConfig(num_hidden_layers=1)
    config.quantization_config = {"quant_method": "awq", "bits": 4}
    with pytest.raises(UnsupportedModelError) as err:
        check_common(config, "test")
    assert str(err.value) == (
        "The config's quantization_config (quant_method 'awq') has no loader in frame, which reads unquantised "
        "safetensors and GGUF files; serve an unquantised checkpoint or a GGUF file instead.")
    config.quantization_config = {"quant_method": "gguf"}
    check_common(config, "test")


class PlainBackend(AttentionBackend):
    """A backend written before windows existed: its hook takes no window, so it would drop one silently."""

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:  # pragma: no cover - never runs
        raise AssertionError

    def attend(self, query, k_cache, v_cache, meta):  # pragma: no cover - never runs
        raise AssertionError


@hookimpl
def frame_attention_create(num_heads, num_kv_heads, head_dim, scale, dtype):
    return PlainBackend(num_heads, num_kv_heads, head_dim, scale, dtype)


def test_a_backend_that_would_drop_a_window_is_refused_before_loading() -> None:
    registry = PluginRegistry()
    hooks = PluginHooks(registry)
    specs = family_specs(hooks, "llama", MistralConfig(num_hidden_layers=2, num_attention_heads=4,
                                                       num_key_value_heads=2, hidden_size=32, sliding_window=64),
                         None)
    module = plugin_module("plain", frame_attention_create=frame_attention_create,
                           frame_attention_platforms=lambda: ["cpu"])
    with registered(registry, "attention", "plain", module), pytest.raises(PluginUnavailableError) as err:
        create_layer_attention(hooks, "plain", specs, world_size=1, rank=0, dtype=torch.float32,
                               platform=hooks.create_platform("cpu", None), options=None)
    assert str(err.value).startswith(
        "The attention backend 'plain' does not implement the attention it was asked for, which layers 0, 1 of this "
        "model need (sliding_window=64); choose another with --attn")


def test_model_family_options_are_validated_against_the_family() -> None:
    from frame.config import build_config
    from frame.engine.selection import model_options
    from frame.errors import ConfigError

    hooks = PluginHooks(PluginRegistry())
    options = model_options(hooks, build_config(model_options={"disable_sliding_window": True}), "gemma")
    assert options == FamilyOptions(disable_sliding_window=True)
    with pytest.raises(ConfigError, match="Unknown model 'llama' option key 'disable_window'; did you mean "
                                          "'disable_sliding_window'"):
        model_options(hooks, build_config(model_options={"disable_window": True}), "llama")
