"""Sampler: turns the step's logits into one token per sampling request, vectorised over the batch.

Order of operations (as in vLLM): logprobs of the raw distribution (if asked), then the logit bias, penalties
(repetition, presence, frequency), the min-tokens ban on stop tokens, temperature, top-k, top-p and min-p, then a draw.
Greedy rows take the argmax. Seeded rows draw from their own generator, so a seeded request's sample does not
depend on what else is in the batch; unseeded rows share the engine's generator. Parameters come from the
runner's :class:`~frame.engine.worker.batch.PersistentBatch` columns, never from scheduler objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from frame.engine.wire.requests import TokenLogprobs
from frame.engine.worker.batch import PersistentBatch
from frame.interfaces.grammar import allowed
from frame.sampling_params import SamplingParams


@dataclass
class SamplerOutput:
    """The sampled token of every sampling row, and its logprobs where the request asked for them."""

    token_ids: np.ndarray
    logprobs: list[TokenLogprobs | None]


class Sampler:
    """Stateless per step; the shared generator of unseeded rows is its only state."""

    def __init__(self, seed: int = 0) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, batch: PersistentBatch, rows: np.ndarray,
                 greedy: np.ndarray | None = None) -> SamplerOutput:
        """Sample ``logits`` ``[len(rows), vocab]``; row ``i`` of the logits belongs to batch row ``rows[i]``.
        ``greedy``: each row's argmax of ``logits`` where the step computed it already (a platform's greedy kernel
        in a recorded step), the answer when every row is plain greedy."""
        if batch.all_plain_greedy(rows):
            if greedy is not None:
                return SamplerOutput(greedy, [None] * len(rows))
            # Every row greedy and nothing to apply (batch.plain_greedy): the argmax alone, which is what the steps
            # below come to. Each of them, a few numpy or torch ops, runs cold once a step after the linears have
            # streamed the weights through the caches: 120 us a token of SmolLM2's single stream.
            if logits.dtype not in _NUMPY_DTYPES:
                logits = logits.float()  # exact, so the same argmax; numpy's, on the host (row_argmax)
            tokens = host_argmax(logits)  # numpy's answer as it is, not through a torch tensor and back
            return SamplerOutput(tokens if tokens is not None else row_argmax(logits).cpu().numpy(), [None] * len(rows))
        logits = logits.float()
        num_logprobs = batch.num_logprobs[rows]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if bool((num_logprobs >= 0).any()) else None
        logits = add_logit_bias(logits, batch, rows)
        logits = self._apply_penalties(logits, batch, rows)
        self._ban_early_stops(logits, batch, rows)
        tokens = self._draw(logits, batch, rows).cpu().numpy()
        logprobs: list[TokenLogprobs | None] = [None] * len(rows)
        if raw_logprobs is not None:
            for i in np.flatnonzero(num_logprobs >= 0).tolist():
                row_lp, token, k = raw_logprobs[i], int(tokens[i]), int(num_logprobs[i])
                top: list[tuple[int, float]] = []
                if k > 0:
                    values, ids = torch.topk(row_lp, k)
                    top = list(zip(ids.tolist(), values.tolist(), strict=True))
                logprobs[i] = TokenLogprobs(token, float(row_lp[token]), top)
        return SamplerOutput(tokens, logprobs)

    # -- logits processing ------------------------------------------------------------------------------
    @staticmethod
    def _apply_penalties(logits: torch.Tensor, batch: PersistentBatch, rows: np.ndarray) -> torch.Tensor:
        rep, pres, freq = batch.repetition_penalty[rows], batch.presence_penalty[rows], batch.frequency_penalty[rows]
        penalised = np.flatnonzero((rep != 1.0) | (pres != 0.0) | (freq != 0.0))
        if not len(penalised):
            return logits
        logits = logits.clone()  # the raw logits may still be needed for logprobs
        for i in penalised.tolist():
            row = int(rows[i])
            state = batch.state_of_row[row]
            assert state is not None
            penalize(logits[i], state.params, batch.all_token_ids(row), batch.output_token_ids(row))
        return logits

    @staticmethod
    def _ban_early_stops(logits: torch.Tensor, batch: PersistentBatch, rows: np.ndarray) -> None:
        num_outputs = batch.num_tokens[rows] - batch.num_prompt_tokens[rows]
        for i in np.flatnonzero(num_outputs < batch.min_tokens[rows]).tolist():
            state = batch.state_of_row[int(rows[i])]
            assert state is not None
            if state.stop_ids:
                logits[i, sorted(state.stop_ids)] = float("-inf")

    def _draw(self, logits: torch.Tensor, batch: PersistentBatch, rows: np.ndarray) -> torch.Tensor:
        temperature = batch.temperature[rows]
        tokens = row_argmax(logits)
        sampled = np.flatnonzero(temperature > 0.0)
        if not len(sampled):
            return tokens
        device = logits.device
        index = torch.from_numpy(sampled).to(device)
        sub = logits[index] / torch.from_numpy(temperature[sampled]).to(device).unsqueeze(1)
        picked = rows[sampled]
        sub = top_k_top_p_min_p(sub, batch.top_k[picked], batch.top_p[picked], batch.min_p[picked])
        probs = torch.softmax(sub, dim=-1)
        # Noise is drawn on the host, where the request generators live, then moved to the logits' device.
        noise = torch.empty(probs.shape, dtype=probs.dtype)
        generators = [batch.state_of_row[int(r)].generator for r in picked]  # type: ignore[union-attr]
        shared = [j for j, g in enumerate(generators) if g is None]
        if shared:
            noise[shared] = noise[shared].exponential_(generator=self.generator)
        for j, gen in enumerate(generators):
            if gen is not None:
                noise[j].exponential_(generator=gen)
        # argmax(p / q) with q ~ Exp(1) draws from p (the exponential-race form of the Gumbel trick).
        tokens[index] = row_argmax(probs / noise.to(device))
        return tokens


def add_logit_bias(logits: torch.Tensor, batch: PersistentBatch, rows: np.ndarray) -> torch.Tensor:
    """Add each biased row's ``logit_bias`` to its logits: one sparse scatter-add over every biased row of the step
    (a copy; the raw logits may still be needed). Rows without a bias cost one boolean column read."""
    biased = np.flatnonzero(batch.has_logit_bias[rows])
    if not len(biased):
        return logits
    states = [batch.state_of_row[int(rows[i])] for i in biased]
    ids = np.concatenate([s.bias_ids for s in states])  # type: ignore[misc]
    values = np.concatenate([s.bias_values for s in states])  # type: ignore[misc]
    row_index = np.repeat(biased, [len(s.bias_ids) for s in states])  # type: ignore[arg-type]
    inside = ids < logits.shape[-1]  # the server refuses ids past the vocabulary; the offline API may not
    device = logits.device
    logits = logits.clone()
    logits.index_put_((torch.from_numpy(row_index[inside]).to(device), torch.from_numpy(ids[inside]).to(device)),
                      torch.from_numpy(values[inside]).to(device, logits.dtype), accumulate=True)
    return logits


def penalize(row: torch.Tensor, params: SamplingParams, seen: np.ndarray, outputs: np.ndarray) -> None:
    """Apply ``params``' repetition penalty over the ``seen`` token ids (prompt and output) and its presence and
    frequency penalties over ``outputs`` to one row of logits, in place."""
    if params.repetition_penalty != 1.0 and len(seen):
        ids = torch.from_numpy(np.unique(seen).astype(np.int64)).to(row.device)
        picked = row[ids]
        penalty = params.repetition_penalty
        row[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
    if (params.presence_penalty or params.frequency_penalty) and len(outputs):
        counts = torch.bincount(torch.from_numpy(outputs.astype(np.int64)), minlength=row.numel())
        counts = counts.to(row.device, row.dtype)
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(row.dtype)


#: Columns per chunk of :func:`row_argmax`'s first pass.
_ARGMAX_CHUNK = 1024
#: Logits dtypes :func:`row_argmax` hands to numpy on the host.
_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` for 2-D ``x``, with the same answer (the first maximum; NaN counts as the largest).

    torch's CPU argmax over a vocabulary-wide row runs about twenty times slower than ``amax``: it took 1.3-1.6 ms
    of a 70 ms batch-64 decode step. So: each chunk's ``amax``, the first chunk holding the row's maximum, then the
    argmax within that chunk alone. On the host, numpy's argmax (the same answer: the first maximum, NaN the largest)
    is one call where that is a dozen torch ops, each of which, run once a step after the linears have streamed the
    weights through the caches, found its code and the dispatcher's tables cold: in a SmolLM2-135M single stream
    they took 219-270 us a token (27 in a loop) and numpy's argmax 68 (5 in a loop).
    """
    on_host = host_argmax(x)
    return torch.from_numpy(on_host) if on_host is not None else _chunked_argmax(x)


def host_argmax(x: torch.Tensor) -> np.ndarray | None:
    """:func:`row_argmax` by numpy, for logits on the host in a dtype numpy has (None otherwise)."""
    if x.device.type == "cpu" and x.dtype in _NUMPY_DTYPES:
        return x.detach().numpy().argmax(axis=-1)
    return None


def _chunked_argmax(x: torch.Tensor) -> torch.Tensor:
    """:func:`row_argmax` in torch ops: each chunk's ``amax``, then the argmax within the first chunk holding the
    row's maximum."""
    rows, width = x.shape
    if width < 4 * _ARGMAX_CHUNK or rows == 0:
        return x.argmax(dim=-1)
    whole = width // _ARGMAX_CHUNK * _ARGMAX_CHUNK
    maxima = x[:, :whole].reshape(rows, -1, _ARGMAX_CHUNK).amax(dim=-1)
    if whole < width:
        maxima = torch.cat([maxima, x[:, whole:].amax(dim=-1, keepdim=True)], dim=1)
    start = maxima.argmax(dim=-1) * _ARGMAX_CHUNK
    # Past the last column the index is clamped: a repeat of the row's last value never comes first.
    columns = (start.unsqueeze(1) + torch.arange(_ARGMAX_CHUNK, device=x.device)).clamp_(max=width - 1)
    return start + x.gather(1, columns).argmax(dim=-1)


def top_k_top_p_min_p(logits: torch.Tensor, top_k: np.ndarray, top_p: np.ndarray, min_p: np.ndarray) -> torch.Tensor:
    """Mask tokens outside each row's top-k (0: no cut) / nucleus / min-p set with -inf."""
    vocab, device = logits.shape[-1], logits.device
    if bool((top_k > 0).any()) or bool((top_p < 1.0).any()):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        k = torch.from_numpy(np.where(top_k > 0, np.minimum(top_k, vocab), vocab)).to(device)
        mask = torch.arange(vocab, device=device).unsqueeze(0) >= k.unsqueeze(1)
        probs = torch.softmax(sorted_logits.masked_fill(mask, float("-inf")), dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
        mask |= before >= torch.from_numpy(top_p).to(device, probs.dtype).unsqueeze(1)
        mask[:, 0] = False
        logits = logits.scatter(1, order, sorted_logits.masked_fill(mask, float("-inf")))
    if bool((min_p > 0.0).any()):
        probs = torch.softmax(logits, dim=-1)
        floor = probs.max(dim=-1, keepdim=True).values * torch.from_numpy(min_p).to(device, probs.dtype).unsqueeze(1)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def mask_disallowed(logits: torch.Tensor, row_index: list[int], rows: np.ndarray) -> None:
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
