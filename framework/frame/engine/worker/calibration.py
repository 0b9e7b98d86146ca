"""Activation statistics for quantization methods that calibrate: the dense model runs once over the method's text
at load, and every linear layer's largest ``|x|`` per input feature is kept.

W8A8 with one activation scale per token loses much where a few input features are far larger than the rest (on
SmolLM2-135M: perplexity +6% against +0.9% for the same weights with unquantized x). SmoothQuant's remedy divides
those features by a per-feature factor and multiplies the weight's columns by it, which needs these maxima; the
method computes the factors in its ``quantize`` (:class:`frame.interfaces.quantization.QuantizationMethod`).

The pass runs before the platform attaches its kernels, so every layer computes with torch's reference code on
the dense weights, on a KV pool of its own that is freed afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from frame.interfaces.attention import AttentionBackend
from frame.interfaces.kv_layout import KVPool, sequence_metadata
from frame.interfaces.model import CausalLM
from frame.layers.basic import Linear


def token_chunks(token_ids: Sequence[int], max_len: int) -> list[list[int]]:
    """The text's tokens in pieces of at most ``max_len`` (each run as one prefill)."""
    return [list(token_ids[i : i + max_len]) for i in range(0, len(token_ids), max_len)]


@torch.inference_mode()
def input_absmax(model: CausalLM, attention: AttentionBackend, chunks: Sequence[Sequence[int]], block_size: int,
                 dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Module path of each :class:`~frame.layers.basic.Linear` the text reaches, to the largest ``|x|`` of each
    of its input features (float32 ``[in]``) over ``chunks``."""
    stats: dict[str, torch.Tensor] = {}

    def recorder(path: str):
        def record(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0]
            top = x.reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
            stats[path] = top if path not in stats else torch.maximum(stats[path], top)

        return record

    handles = [module.register_forward_pre_hook(recorder(path))
               for path, module in model.named_modules() if isinstance(module, Linear)]
    spec = model.kv_cache_spec
    try:
        for chunk in chunks:
            if not chunk:
                continue
            blocks = math.ceil(len(chunk) / block_size)
            pool = KVPool(spec, blocks, block_size, dtype, device, zeroed=True)
            meta = attention.build_metadata(sequence_metadata([0], [len(chunk)], [range(blocks)], block_size, device))
            ids = torch.tensor(chunk, dtype=torch.int64, device=device)
            model(ids, torch.arange(len(chunk), device=device), pool.caches, meta)
    finally:
        for handle in handles:
            handle.remove()
    return stats
