"""Fixtures of the cpu platform's tests."""

from __future__ import annotations

from collections.abc import Callable

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
