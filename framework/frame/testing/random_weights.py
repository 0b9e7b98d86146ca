"""Random values for a checkpoint made at test time, so every tensor a family loads is seen to arrive."""

from __future__ import annotations

import torch


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter (biases and norm weights too) random values, so none can go unloaded unnoticed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1 + 0.2 * noise if "norm" in name else 0.1 * noise)
