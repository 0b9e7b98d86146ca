"""Verifying drafts: rejection sampling over the target model's distributions at every lookahead position.

A request with drafts ``d_1..d_k`` gets ``k + 1`` rows of target logits: row ``j`` is the distribution of the
token after ``d_j`` (row 0 after the request's last real token). Going left to right, draft ``d_{j+1}`` is kept
with probability ``min(1, p_j(d) / q_j(d))``; at the first rejection a token is drawn from the residual
``max(p_j - q_j, 0)`` (renormalised) and the request stops there; when every draft is kept, a bonus token is
drawn from ``p_k``. This emits tokens distributed exactly as the target would sample them one at a time (Leviathan
et al., 2023). A proposal without draft probabilities counts as ``q_j = one-hot(d_{j+1})``. Greedy requests keep
drafts while they equal the target's argmax. ``p_j`` is the request's full sampling pipeline at that position:
the logit bias, penalties and the ``min_tokens`` ban see the drafts before it, then temperature, top-k, top-p and min-p.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from frame.engine.wire.requests import TokenLogprobs
from frame.engine.worker.batch import PersistentBatch
from frame.engine.worker.sampler import penalize, row_argmax, top_k_top_p_min_p


@dataclass
class Verified:
    """The tokens one request emits after verification (the kept drafts, then one of the target's own) and their
    logprobs under the raw target distribution, where asked."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None


def verify(logits: torch.Tensor, batch: PersistentBatch, rows: list[int], drafts: list[list[int]],
           draft_probs: list[torch.Tensor | None], generator: torch.Generator) -> list[Verified]:
    """Verify each request's drafts. ``logits`` holds ``len(drafts[i]) + 1`` consecutive rows per request, in
    order; ``rows`` are their batch rows. Unseeded requests draw from ``generator``."""
    logits = logits.float()
    out, start = [], 0
    for row, draft, q in zip(rows, drafts, draft_probs, strict=True):
        span = logits[start : start + len(draft) + 1]
        start += len(draft) + 1
        out.append(_verify_one(span, batch, row, draft, q, generator))
    return out


def _verify_one(span: torch.Tensor, batch: PersistentBatch, row: int, draft: list[int], q: torch.Tensor | None,
                shared: torch.Generator) -> Verified:
    state = batch.state_of_row[row]
    assert state is not None
    params = state.params
    processed = _process(span, batch, row, draft)
    tokens: list[int] = []
    if params.temperature == 0.0:
        best = row_argmax(processed).tolist()
        for j, token in enumerate(draft):
            if best[j] != token:
                break
            tokens.append(token)
        tokens.append(best[len(tokens)])
    else:
        probs = torch.softmax(processed / params.temperature, dim=-1).cpu()
        generator = state.generator or shared
        for j, token in enumerate(draft):
            p = probs[j]
            q_token = 1.0 if q is None else float(q[j, token])
            if q_token > 0 and torch.rand((), generator=generator).item() * q_token < float(p[token]):
                tokens.append(token)
                continue
            residual = p.clone()
            if q is None:
                residual[token] = 0.0
            else:
                residual = (residual - q[j].to(residual.dtype)).clamp_(min=0.0)
            tokens.append(_draw(residual if float(residual.sum()) > 0 else p, generator))
            break
        else:
            tokens.append(_draw(probs[len(draft)], generator))
    logprobs = None
    if params.logprobs is not None:
        raw = torch.log_softmax(span[: len(tokens)], dim=-1)
        logprobs = [_logprob(raw[j], token, params.logprobs) for j, token in enumerate(tokens)]
    return Verified(tokens, logprobs)


def _process(span: torch.Tensor, batch: PersistentBatch, row: int, draft: list[int]) -> torch.Tensor:
    """Each position's logits after the logit bias, penalties, the min-tokens ban and top-k / top-p / min-p (not
    temperature)."""
    state = batch.state_of_row[row]
    assert state is not None
    params = state.params
    history = batch.all_token_ids(row)
    num_outputs = len(history) - state.num_prompt_tokens
    span = span.clone()
    if state.bias_ids is not None and state.bias_values is not None:
        inside = state.bias_ids < span.shape[-1]
        span[:, torch.from_numpy(state.bias_ids[inside]).to(span.device)] += \
            torch.from_numpy(state.bias_values[inside]).to(span.device, span.dtype)
    for j in range(span.shape[0]):
        seen = np.concatenate([history, np.asarray(draft[:j], dtype=history.dtype)]) if j else history
        penalize(span[j], params, seen, seen[state.num_prompt_tokens:])
        if num_outputs + j < params.min_tokens and state.stop_ids:
            span[j, sorted(state.stop_ids)] = float("-inf")
    if params.temperature == 0.0:
        return span
    count = span.shape[0]
    return top_k_top_p_min_p(span, np.full(count, params.top_k or 0, dtype=np.int64),
                             np.full(count, params.top_p, dtype=np.float32),
                             np.full(count, params.min_p, dtype=np.float32))


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator).item())


def _logprob(row: torch.Tensor, token: int, top: int) -> TokenLogprobs:
    pairs: list[tuple[int, float]] = []
    if top > 0:
        values, ids = torch.topk(row, top)
        pairs = list(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprobs(token, float(row[token]), pairs)
