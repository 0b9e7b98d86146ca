"""The platform's greedy kernel (``csrc/row_argmax.cpp``): each row's argmax equals numpy's, ties, NaNs, infinities
and every tail length included; and a recorded step that ends with it replays it.

The kernel has an AVX-512 path, an AVX2 path and plain C++; this file checks the one this CPU builds. Run it with
``FRAME_CPU_DISABLE=avx512f`` (the AVX2 path) or ``=avx2`` (plain C++) to check the others."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from frame_platform_cpu import kernels
from frame_platform_cpu.platform import CpuOptions, CpuPlatform
from frame_platform_cpu.record import record
from frame_platform_cpu.replay import compile_replay

_WHY_NOT = kernels.unavailable_reason()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=f"the cpu platform's kernels cannot be built: {_WHY_NOT}")


def native_argmax(logits: torch.Tensor) -> np.ndarray:
    out = torch.full((logits.shape[0],), -1, dtype=torch.int64)
    kernels.greedy_tokens()(logits, out)
    return out.numpy()


@pytest.mark.parametrize("width", [1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, 49152, 49155])
def test_random_rows_match_numpy(width: int) -> None:
    generator = torch.Generator().manual_seed(width)
    logits = torch.randn(5, width, generator=generator)
    assert np.array_equal(native_argmax(logits), logits.numpy().argmax(-1))


@pytest.mark.parametrize("width", [3, 16, 40, 1001])
def test_ties_give_the_first_maximum(width: int) -> None:
    generator = torch.Generator().manual_seed(width)
    logits = torch.randint(-2, 3, (64, width), generator=generator).float()  # many equal maxima a row
    assert np.array_equal(native_argmax(logits), logits.numpy().argmax(-1))
    flat = torch.zeros(2, width)  # every column the maximum: the first
    assert native_argmax(flat).tolist() == [0, 0]


@pytest.mark.parametrize("width", [5, 16, 47, 4096])
def test_nans_and_infinities_follow_numpy(width: int) -> None:
    logits = torch.randn(6, width, generator=torch.Generator().manual_seed(1))
    logits[0, width // 2] = float("nan")  # a NaN counts as the largest: the first one wins
    logits[1, width - 1] = float("nan")
    logits[1, width // 3] = float("nan")
    logits[2, :] = float("-inf")  # nothing larger than -inf: the first column
    logits[3, width - 1] = float("inf")
    logits[4, 0] = float("nan")
    logits[5, :] = float("nan")
    assert np.array_equal(native_argmax(logits), logits.numpy().argmax(-1))


def test_other_dtypes_and_strided_rows() -> None:
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(2))
    assert np.array_equal(native_argmax(logits.bfloat16()), logits.bfloat16().float().numpy().argmax(-1))
    wide = torch.randn(3, 320)
    assert np.array_equal(native_argmax(wide[:, :300]), wide[:, :300].numpy().argmax(-1))


def test_misuse_is_refused() -> None:
    op = torch.ops.frame_cpu.row_argmax_into.default
    with pytest.raises(RuntimeError, match="int64"):
        op(torch.randn(2, 8), torch.empty(2, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="contiguous columns"):
        op(torch.randn(8, 2).t(), torch.empty(2, dtype=torch.int64))


def test_a_recorded_step_replays_the_argmax() -> None:
    greedy = CpuPlatform(CpuOptions()).greedy_kernel()
    assert greedy is not None
    weight, hidden, out = torch.randn(500, 32), torch.randn(3, 32), torch.zeros(3, dtype=torch.int64)

    def step() -> torch.Tensor:
        logits = hidden @ weight.t()
        greedy(logits, out)
        return logits

    recording, logits = record(step)
    assert out.tolist() == logits.argmax(-1).tolist()
    replay = compile_replay(recording)
    hidden.copy_(torch.randn(3, 32))
    out.zero_()
    logits = replay()
    assert out.tolist() == logits.argmax(-1).tolist() == (hidden @ weight.t()).argmax(-1).tolist()


def test_no_kernel_without_native_kernels() -> None:
    assert CpuPlatform(CpuOptions(native_kernels=False)).greedy_kernel() is None
