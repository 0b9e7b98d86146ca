"""Token bitmasks: int32 words, bit ``t % 32`` of word ``t // 32`` set when token ``t`` may come next.

The engine core fills one row per sampled position of a constrained request (:mod:`frame.engine.structured`),
the rows travel packed in the step plan, and the runner turns every disallowed token's logit into -inf before it
samples (and before it verifies drafts).
"""

from __future__ import annotations

import numpy as np
import torch


def words_for(vocab_size: int) -> int:
    """int32 words of one row of a ``vocab_size``-token mask."""
    return -(-vocab_size // 32)


def from_bytes(data: bytes, vocab_size: int) -> np.ndarray:
    """Mask rows packed in a step plan, as int32 ``[rows, words]``."""
    return np.frombuffer(data, dtype="<i4").reshape(-1, words_for(vocab_size))


def unpack(rows: np.ndarray, vocab_size: int) -> np.ndarray:
    """Bool ``[len(rows), vocab_size]``: True where a token is allowed."""
    bits = np.unpackbits(np.ascontiguousarray(rows, dtype="<i4").view(np.uint8), axis=-1, bitorder="little")
    return bits[:, :vocab_size].astype(bool)


def apply(logits: torch.Tensor, row_index: list[int], rows: np.ndarray) -> None:
    """Set the logits of disallowed tokens to -inf, in place: mask row ``i`` applies to logits row
    ``row_index[i]``."""
    if not row_index:
        return
    allowed = torch.from_numpy(unpack(rows, logits.shape[-1])).to(logits.device)
    index = torch.tensor(row_index, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
