"""Token bitmasks: packing order, and masking the right logits rows whichever rows are constrained."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from frame.engine.worker.sampler import mask_disallowed
from frame.interfaces import grammar as bitmask

VOCAB = 100  # not a multiple of 32: the last word is partly padding


def rows_allowing(allowed: list[set[int]]) -> np.ndarray:
    rows = np.zeros((len(allowed), bitmask.words_for(VOCAB)), dtype=np.uint32)
    for r, tokens in enumerate(allowed):
        for t in tokens:
            rows[r, t // 32] |= np.uint32(1 << (t % 32))
    return rows.view(np.int32)


def test_bit_t_of_a_row_allows_token_t() -> None:
    allowed = [{0, 31, 32, 63, 99}, set(range(VOCAB)), set()]
    rows = rows_allowing(allowed)
    for unpacked in (bitmask.unpack(rows, VOCAB), bitmask.allowed(rows, VOCAB).numpy()):
        assert unpacked.shape == (3, VOCAB)
        for r, tokens in enumerate(allowed):
            assert set(np.flatnonzero(unpacked[r]).tolist()) == tokens
    assert np.array_equal(bitmask.from_bytes(rows.astype("<i4").tobytes(), VOCAB), rows)


@pytest.mark.parametrize("row_index", [[0, 1, 2, 3], [3, 1], [2]])
def test_apply_masks_only_the_named_rows(row_index: list[int]) -> None:
    rng = np.random.default_rng(len(row_index))
    allowed = [set(rng.choice(VOCAB, size=10, replace=False).tolist()) for _ in row_index]
    logits = torch.randn(4, VOCAB)
    before = logits.clone()
    mask_disallowed(logits, row_index, rows_allowing(allowed))
    for r in range(4):
        if r not in row_index:
            assert torch.equal(logits[r], before[r])
            continue
        tokens = allowed[row_index.index(r)]
        finite = set(torch.isfinite(logits[r]).nonzero().flatten().tolist())
        assert finite == tokens
        assert torch.equal(logits[r, sorted(tokens)], before[r, sorted(tokens)])
