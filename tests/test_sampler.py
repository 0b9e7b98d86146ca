"""frame.engine.worker.sampler: row_argmax is torch's argmax, answer for answer, on vocabulary-wide rows (numpy's on
the host, the chunked torch ops elsewhere: both checked here); the logit bias equals a row-by-row reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from frame.engine.wire.plan import NewRequest
from frame.engine.worker.batch import PersistentBatch
from frame.engine.worker.sampler import Sampler, _chunked_argmax, add_logit_bias, row_argmax
from frame.errors import InvalidSamplingError
from frame.sampling_params import SamplingParams

ARGMAXES = pytest.mark.parametrize("argmax", [row_argmax, _chunked_argmax], ids=["row_argmax", "chunked"])


@ARGMAXES
@pytest.mark.parametrize("width", [100, 4096, 49152, 50257])  # short rows, whole chunks, a ragged last chunk
def test_row_argmax_equals_torch_argmax(width: int, argmax) -> None:
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(width))
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    assert torch.equal(argmax(x[:1]), x[:1].argmax(dim=-1))  # a single stream's one row


@ARGMAXES
def test_ties_nan_and_infinities_resolve_as_torch_does(argmax) -> None:
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
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    assert torch.equal(argmax(x.half()), x.half().argmax(dim=-1))


@ARGMAXES
def test_row_argmax_of_a_strided_view(argmax) -> None:
    x = torch.randn(6, 2 * 8192, generator=torch.Generator().manual_seed(1))[:, ::2]
    assert torch.equal(argmax(x), x.argmax(dim=-1))


def test_row_argmax_of_bfloat16_logits_takes_the_torch_ops() -> None:  # numpy has no bfloat16
    x = torch.randn(3, 50257, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))


def _batch(biases: list[dict[int, float] | None]) -> PersistentBatch:
    batch = PersistentBatch(len(biases), 64, 4)
    for i, bias in enumerate(biases):
        batch.add(NewRequest(req_id=f"r{i}", prompt_token_ids=[1, 2], params=SamplingParams(logit_bias=bias),
                             block_ids=[i], num_computed_tokens=0, num_new_tokens=2), None)
    return batch


def test_logit_bias_equals_a_row_by_row_reference() -> None:
    vocab = 1000
    biases = [{3: 5.0, 999: -100.0}, None, {0: 100.0, 3: -2.5, 500: 0.25}, {}, {7: 1.0, 5000: 3.0}]
    batch = _batch(biases)
    rows = np.asarray([4, 2, 0, 1, 3])  # the step's order is not the batch's
    logits = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(0))
    expected = logits.clone()
    for i, row in enumerate(rows.tolist()):
        for token, bias in (biases[row] or {}).items():
            if token < vocab:  # ids past the vocabulary are dropped (the server refuses them first)
                expected[i, token] += bias
    got = add_logit_bias(logits, batch, rows)
    assert torch.equal(got, expected)
    assert not torch.equal(logits, expected)  # the raw logits are left for the logprobs


def test_logit_bias_steers_the_draw_and_leaves_logprobs_raw() -> None:
    batch = _batch([{3: 100.0}])
    batch.num_logprobs[0] = 1
    logits = torch.zeros(1, 10)
    logits[0, 7] = 5.0
    out = Sampler()(logits, batch, np.asarray([0]))
    assert out.token_ids.tolist() == [3]
    raw = torch.log_softmax(logits[0], dim=-1)
    assert out.logprobs[0] is not None and out.logprobs[0].logprob == pytest.approx(raw[3].item())
    assert out.logprobs[0].top[0][0] == 7


@pytest.mark.parametrize(("bias", "why"), [({-1: 1.0}, "non-negative"), ({5: 100.5}, "between -100 and 100"),
                                           ({5: float("nan")}, "between -100 and 100")])
def test_logit_bias_out_of_range_is_refused(bias: dict[int, float], why: str) -> None:
    with pytest.raises(InvalidSamplingError, match=why):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("params", [dict(temperature=0.7), dict(logprobs=2), dict(logit_bias={3: 1.0}),
                                    dict(repetition_penalty=1.2), dict(presence_penalty=0.5),
                                    dict(frequency_penalty=0.5), dict(min_tokens=3)])
def test_only_rows_with_nothing_to_apply_are_plain_greedy(params: dict) -> None:
    batch = PersistentBatch(2, 64, 4)
    for i, p in enumerate([{}, params]):
        greedy = SamplingParams(**{"temperature": 0.0, **p})
        batch.add(NewRequest(req_id=f"r{i}", prompt_token_ids=[1, 2], params=greedy, block_ids=[i],
                             num_computed_tokens=0, num_new_tokens=2), None)
    assert batch.plain_greedy.tolist() == [True, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_plain_greedy_step_samples_what_the_whole_sampler_does(dtype: torch.dtype) -> None:
    batch = PersistentBatch(3, 64, 4)
    for i in range(3):
        batch.add(NewRequest(req_id=f"r{i}", prompt_token_ids=[1, 2], params=SamplingParams(temperature=0.0),
                             block_ids=[i], num_computed_tokens=0, num_new_tokens=2), None)
    assert batch.plain_greedy.all()
    rows = np.asarray([2, 0, 1])
    logits = torch.randn(3, 50257, generator=torch.Generator().manual_seed(3)).to(dtype)
    fast = Sampler()(logits, batch, rows)
    batch.plain_greedy[:] = False  # the whole way: logprobs, bias, penalties, bans, the draw
    whole = Sampler()(logits, batch, rows)
    assert fast.token_ids.tolist() == whole.token_ids.tolist() == logits.float().argmax(dim=-1).tolist()
    assert fast.logprobs == whole.logprobs == [None, None, None]
