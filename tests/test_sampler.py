"""frame.engine.worker.sampler.row_argmax: torch's argmax, answer for answer, on vocabulary-wide rows."""

from __future__ import annotations

import pytest
import torch
from frame.engine.worker.sampler import row_argmax


@pytest.mark.parametrize("width", [100, 4096, 49152, 50257])  # short rows, whole chunks, a ragged last chunk
def test_row_argmax_equals_torch_argmax(width: int) -> None:
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(width))
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))


def test_ties_nan_and_infinities_resolve_as_torch_does() -> None:
    width = 50257
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(0))
    x[0, [5, 3000, 9000]] = 50.0  # the same maximum in several chunks: the first wins
    x[1, [2000, 2001]] = 50.0  # twice in one chunk
    x[2, -1] = 50.0  # the very last column, inside the clamped last chunk
    x[3, [width - 3, width - 1]] = 50.0
    x[4] = float("-inf")  # nothing but -inf: index 0
    x[5, [7000, 300]] = float("nan")  # NaN counts as the largest, the first one wins
    x[6, 12000] = float("inf")
    x[7, 40000:] = 50.0
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))


def test_row_argmax_of_a_strided_view() -> None:
    x = torch.randn(6, 2 * 8192, generator=torch.Generator().manual_seed(1))[:, ::2]
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
