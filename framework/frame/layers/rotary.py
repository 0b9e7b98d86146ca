"""Rotary position embedding (the rotate-half layout) and the scalings checkpoints ask for.

:func:`rope_parameters` reads a config's rope settings (transformers 5's ``rope_parameters``, per layer type where
a config has several, or the older ``rope_scaling`` plus ``rope_theta``); :class:`RotaryEmbedding` turns them into
a cos/sin table that :class:`~frame.layers.basic.RotateHalves` applies. Supported ``rope_type``: ``default``,
``linear``, ``llama3``, ``yarn``, ``dynamic`` and ``longrope``; any other is an
:class:`~frame.errors.UnsupportedModelError` naming the field.

Two scalings depend on the length of the sequence being run, which a paged KV cache cannot follow (cached keys
keep their rotation). Dynamic NTK uses the unscaled frequencies, exactly what transformers does up to
``max_position_embeddings``. LongRoPE rotates positions below ``original_max_position_embeddings`` with the short
factors and later ones with the long factors, which is what transformers does for every sequence that stays below
that length (past it transformers re-rotates the whole sequence with the long factors, which cached keys cannot).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from frame.errors import UnsupportedModelError

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


def rope_parameters(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The rope dict with ``rope_type``, ``rope_theta`` and ``partial_rotary_factor``: ``rope_parameters``
    (transformers 5; ``rope_parameters[layer_type]`` where it holds one per layer type) or the older
    ``rope_scaling`` plus ``rope_theta`` attributes."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0)
    if getattr(config, "original_max_position_embeddings", None):  # Phi-3 keeps it beside the rope dict
        params.setdefault("original_max_position_embeddings", config.original_max_position_embeddings)
    return params


def _default(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(inv_freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    old_len = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, base: float, p: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    original = p.get("original_max_position_embeddings") or max_positions
    factor = p.get("factor") or max_positions / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention_factor = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(p.get("beta_fast") or 32), correction_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolate = 1 - ramp  # 1 where the original frequency is kept
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(attention_factor)


def _longrope(dim: int, base: float, p: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    float, int]:
    """Short and long inverse frequencies, the cos/sin factor, and the position where the long ones start."""
    original = p["original_max_position_embeddings"]
    factor = p.get("factor") or max_positions / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    short = 1.0 / (torch.tensor(p["short_factor"], dtype=torch.float32) * base**shape)
    long = 1.0 / (torch.tensor(p["long_factor"], dtype=torch.float32) * base**shape)
    return short, long, float(attention_factor), int(original)


def inverse_frequencies(rope: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """float32 ``[dim // 2]`` inverse frequencies and the factor cos/sin are multiplied by (not ``longrope``,
    whose frequencies depend on the position: :class:`RotaryEmbedding` builds its table)."""
    kind, base = rope["rope_type"], float(rope["rope_theta"])
    if kind in ("default", "dynamic"):
        return _default(dim, base), 1.0
    if kind == "linear":
        return _default(dim, base) / rope["factor"], 1.0
    if kind == "llama3":
        return _llama3(_default(dim, base), rope), 1.0
    if kind == "yarn":
        return _yarn(dim, base, rope, max_positions)
    raise UnsupportedModelError(
        f"The config's rope_parameters.rope_type {kind!r} is not implemented; frame implements "
        f"{', '.join(ROPE_TYPES)}.", param="model")


class RotaryEmbedding(torch.nn.Module):
    """A cos/sin table over every position up to ``max_positions`` for the first ``rotary_dim`` features of each
    head (all of them unless the rope's ``partial_rotary_factor`` is below one); :meth:`lookup` once per step,
    ``frame.layers.RotateHalves`` applies it."""

    def __init__(self, rope: dict[str, Any], head_dim: int, max_positions: int, device: torch.device) -> None:
        super().__init__()
        self.rotary_dim = int(head_dim * float(rope.get("partial_rotary_factor") or 1.0))
        positions = torch.arange(max_positions, dtype=torch.float32)
        if rope["rope_type"] == "longrope":
            short, long, factor, original = _longrope(self.rotary_dim, float(rope["rope_theta"]), rope, max_positions)
            freqs = torch.cat([torch.outer(positions[:original], short), torch.outer(positions[original:], long)])
        else:
            inv_freq, factor = inverse_frequencies(rope, self.rotary_dim, max_positions)
            freqs = torch.outer(positions, inv_freq)
        self.register_buffer("cos", (freqs.cos() * factor).to(device), persistent=False)
        self.register_buffer("sin", (freqs.sin() * factor).to(device), persistent=False)

        self._in_dtype: dict[tuple[torch.dtype, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[num_tokens, 1, rotary_dim // 2]`` of ``positions``, in ``dtype``.

        The tables are rounded to ``dtype`` once (the same values as rounding the rows looked up), so a step gathers
        rows and converts nothing: two fewer ops a step, each cold once the weights have streamed through."""
        key = (dtype, self.cos.device)
        if key not in self._in_dtype:
            self._in_dtype[key] = (self.cos.to(dtype), self.sin.to(dtype))
        cos, sin = self._in_dtype[key]
        return cos[positions][:, None, :], sin[positions][:, None, :]
