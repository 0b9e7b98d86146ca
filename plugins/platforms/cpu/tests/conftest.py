"""Fixtures of the cpu platform's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

#: How a step program may run a stretch: (teams, bound calls).
RUN_MODES = ((True, True), (True, False), (False, False))


@pytest.fixture
def runs_every_way() -> Callable[..., None]:
    """``check(program, out, expected, *context)``: the program gives ``expected`` bound from records, from its
    arguments each run, and each call with its own parallel region (``out`` zeroed before each run)."""

    def check(program, out: torch.Tensor, expected: torch.Tensor, *context: object) -> None:
        for teams, bound in RUN_MODES:
            program.set_teams(teams)
            program.set_bound(bound)
            out.zero_()
            assert torch.equal(program.run(), expected), (*context, teams, bound)

    return check


@pytest.fixture
def torch_threads() -> Iterator[Callable[[int], None]]:
    """``torch_threads(n)``: run the test's kernels on n threads; torch's own count comes back afterwards."""
    previous = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(previous)
