"""Per-layer attention: the model family's specs, split over the ranks, turned into backends.

The family states what each layer needs (:func:`family_specs`); :func:`create_layer_attention` creates one backend
of the selected plugin per distinct spec (this rank's heads) and refuses, in one sentence and before any weight is
read, a backend that does not honour a layer's sliding window or soft-cap.
"""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel
from transformers import PretrainedConfig

from frame.errors import ConfigError, PluginUnavailableError, UnsupportedModelError
from frame.interfaces.attention import AttentionBackend, AttentionSpec, UnsupportedAttentionError
from frame.interfaces.platform import Platform
from frame.parallel import HeadPartition
from frame.plugins.hooks import PluginHooks


def config_specs(hf_config: PretrainedConfig) -> list[AttentionSpec]:
    """Full attention on every layer from the config's head counts: what a family that states nothing gets."""
    num_heads = hf_config.num_attention_heads
    num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
    spec = AttentionSpec(num_heads, num_kv_heads, head_dim, head_dim**-0.5)
    return [spec] * hf_config.num_hidden_layers


def family_specs(hooks: PluginHooks, family: str, hf_config: PretrainedConfig,
                 options: BaseModel | None) -> list[AttentionSpec]:
    """The family's per-layer specs (or :func:`config_specs`), checked to share head counts and head size."""
    specs = hooks.model_attention(family, hf_config, options)
    if specs is None:
        specs = config_specs(hf_config)
    if not specs:
        raise UnsupportedModelError(f"The model family '{family}' stated no attention layers for this model.")
    shapes = {(s.num_heads, s.num_kv_heads, s.head_dim) for s in specs}
    if len(shapes) > 1:
        raise UnsupportedModelError(
            f"The model family '{family}' states layers with different head counts or sizes {sorted(shapes)}; "
            "frame's KV pool needs one shape for every layer."
        )
    for i, spec in enumerate(specs):
        if spec.kv_source is not None and not 0 <= spec.kv_source < i:
            raise UnsupportedModelError(f"Layer {i} reads the KV of layer {spec.kv_source}, which is not before it.")
    return list(specs)


def local_spec(spec: AttentionSpec, world_size: int, rank: int) -> AttentionSpec:
    """``spec`` with this rank's heads; a ConfigError naming the fix when they cannot be split."""
    try:
        heads = HeadPartition.of(spec.num_heads, spec.num_kv_heads, world_size, rank)
    except ValueError as err:
        raise ConfigError(f"{err}.", param="tensor_parallel_size") from None
    return spec.with_heads(heads.q_count, heads.kv_count)


def _layers_needing(specs: list[AttentionSpec], local: AttentionSpec) -> str:
    layers = [str(i) for i, s in enumerate(specs) if s.features == local.features]
    shown = ", ".join(layers[:8]) + (", ..." if len(layers) > 8 else "")
    return f"layer{'s' if len(layers) > 1 else ''} {shown}"


def create_layer_attention(
    hooks: PluginHooks, attn: str, specs: list[AttentionSpec], *, world_size: int, rank: int, dtype,
    platform: Platform, options: BaseModel | None,
) -> list[AttentionBackend]:
    """One backend per layer (layers with equal specs share one), each made for this rank's heads."""
    made: dict[AttentionSpec, AttentionBackend] = {}
    layers = []
    for spec in specs:
        # Sharing KV changes which cache a layer reads, not the backend it calls.
        local = local_spec(dataclasses.replace(spec, kv_source=None), world_size, rank)
        if local not in made:
            made[local] = _create(hooks, attn, local, specs, dtype, platform, options)
        layers.append(made[local])
    return layers


def _create(hooks: PluginHooks, attn: str, local: AttentionSpec, specs: list[AttentionSpec], dtype,
            platform: Platform, options: BaseModel | None) -> AttentionBackend:
    def refuse(detail: str) -> PluginUnavailableError:
        serving = [n for n in hooks.registry.names("attention") if n != attn]
        return PluginUnavailableError(
            f"The attention backend '{attn}' {detail}, which {_layers_needing(specs, local)} of this model need "
            f"({', '.join(local.features)}); choose another with --attn (installed: {', '.join(serving) or 'none'}).",
            param="attn",
        )

    try:
        backend = hooks.create_attention(
            attn, num_heads=local.num_heads, num_kv_heads=local.num_kv_heads, head_dim=local.head_dim,
            scale=local.scale, dtype=dtype, platform=platform, options=options, sliding_window=local.sliding_window,
            logit_softcap=local.logit_softcap,
        )
    except UnsupportedAttentionError as err:
        raise refuse(f"refuses it ({str(err).rstrip('.')})") from None
    # A backend whose hook predates windows and soft-caps drops them without a word: refuse it instead.
    got = (getattr(backend, "sliding_window", None), getattr(backend, "logit_softcap", None))
    if got != (local.sliding_window, local.logit_softcap):
        raise refuse("does not implement the attention it was asked for")
    return backend
