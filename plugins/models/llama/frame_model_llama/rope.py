"""Rotary position embedding (the rotate-half layout) with the scaling variants Llama-family configs use.

Supported ``rope_type``: ``default``, ``linear``, ``llama3``, ``yarn`` and ``dynamic``. Dynamic NTK rescales
with the length of the sequence being run, which a paged KV cache cannot follow (cached keys keep their
rotation), so frame uses the unscaled frequencies, exactly what transformers does up to
``max_position_embeddings``.
"""

from __future__ import annotations

import math
from typing import Any

import torch


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


def inverse_frequencies(rope: dict[str, Any], dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
    """float32 ``[dim // 2]`` inverse frequencies and the factor cos/sin are multiplied by."""
    kind, base = rope["rope_type"], float(rope["rope_theta"])
    if kind in ("default", "dynamic"):
        return _default(dim, base), 1.0
    if kind == "linear":
        return _default(dim, base) / rope["factor"], 1.0
    if kind == "llama3":
        return _llama3(_default(dim, base), rope), 1.0
    if kind == "yarn":
        return _yarn(dim, base, rope, max_positions)
    raise ValueError(f"rope_type {kind!r} is not supported by the llama model family")


class RotaryEmbedding(torch.nn.Module):
    """A cos/sin table over every position up to ``max_positions``; ``frame.layers.RotateHalves`` applies it."""

    def __init__(self, rope: dict[str, Any], head_dim: int, max_positions: int, device: torch.device) -> None:
        super().__init__()
        inv_freq, factor = inverse_frequencies(rope, head_dim, max_positions)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", (freqs.cos() * factor).to(device), persistent=False)
        self.register_buffer("sin", (freqs.sin() * factor).to(device), persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[num_tokens, 1, head_dim // 2]`` of ``positions``, in ``dtype``; once per step."""
        return self.cos[positions].to(dtype)[:, None, :], self.sin[positions].to(dtype)[:, None, :]
