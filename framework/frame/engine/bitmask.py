"""Token bitmasks: int32 words, bit ``t % 32`` of word ``t // 32`` set when token ``t`` may come next.

The engine core fills one row per sampled position of a constrained request (:mod:`frame.engine.core.structured`),
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


def allowed(rows: np.ndarray, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool ``[len(rows), vocab_size]`` tensor on ``device``: True where a token is allowed (shifts, no copies
    through numpy bit arrays: about 4x faster than :func:`unpack` for a batch of 64 rows)."""
    words_np = np.ascontiguousarray(rows, dtype=np.int32)
    if not words_np.flags.writeable:  # a grammar backend's read-only buffer; torch wants memory it may own
        words_np = words_np.copy()
    words = torch.from_numpy(words_np).to(device)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    return ((words.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab_size].bool()


def apply(logits: torch.Tensor, row_index: list[int], rows: np.ndarray) -> None:
    """Set the logits of disallowed tokens to -inf, in place: mask row ``i`` applies to logits row
    ``row_index[i]``."""
    if not row_index:
        return
    ok = allowed(rows, logits.shape[-1], logits.device)
    if row_index == list(range(logits.shape[0])):  # every row constrained, in order: no gather
        logits.masked_fill_(~ok, float("-inf"))
        return
    index = torch.tensor(row_index, device=logits.device)
    logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(~ok, float("-inf")))
